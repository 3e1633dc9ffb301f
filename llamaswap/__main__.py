from llamaswap.cli import main

main()
