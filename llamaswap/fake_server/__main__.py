from llamaswap.fake_server import main

main()
