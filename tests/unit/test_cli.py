"""The ``llamaswap`` command line: ``--listen``, ``--help``, ``check-config --help``.

In-process; tests/e2e/test_cli.py runs it as a program."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamaswap._serve import listen_address
from llamaswap.cli import QUICKSTART_CONFIG, main
from llamaswap.errors import ListenError

HINT = "; choose another address with --listen HOST:PORT"


@pytest.mark.parametrize(
    ("listen", "expected"),
    [
        ("127.0.0.1:8080", ("127.0.0.1", 8080)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("localhost:65535", ("localhost", 65535)),
        ("0.0.0.0:080", ("0.0.0.0", 80)),
        ("[::1]:8080", ("::1", 8080)),
        ("[::]:0", ("::", 0)),
    ],
)
def test_host_colon_port_is_listened_on(listen: str, expected: tuple[str, int]) -> None:
    assert listen_address(listen) == expected


@pytest.mark.parametrize(
    ("listen", "reason"),
    [
        ("127.0.0.1:99999", "port 99999 is out of range (0 to 65535; 0 picks a free port)"),
        ("127.0.0.1:65536", "port 65536 is out of range (0 to 65535; 0 picks a free port)"),
        ("127.0.0.1:-1", "port '-1' is not a number (0 to 65535; 0 picks a free port)"),
        ("127.0.0.1:abc", "port 'abc' is not a number (0 to 65535; 0 picks a free port)"),
        ("127.0.0.1:٨٠", "port '٨٠' is not a number (0 to 65535; 0 picks a free port)"),
        ("127.0.0.1", "no port (as in 127.0.0.1:8080; port 0 picks a free port)"),
        ("127.0.0.1:", "no port (as in 127.0.0.1:8080; port 0 picks a free port)"),
        ("[::1]", "no port (as in [::1]:8080; port 0 picks a free port)"),
        ("[::1]:", "no port (as in [::1]:8080; port 0 picks a free port)"),
        ("", "no host and no port (as in 127.0.0.1:8080; 0.0.0.0:8080 is every interface)"),
        (":8080", "no host (as in 127.0.0.1:8080; 0.0.0.0:8080 is every interface)"),
        ("[]:8080", "no host (as in 127.0.0.1:8080; 0.0.0.0:8080 is every interface)"),
        ("::1:8080", "a host with ':' in it goes in brackets, as in [::1]:8080"),
        ("[::1", "an address in brackets is written as in [::1]:8080"),
        ("[::1]8080", "an address in brackets is written as in [::1]:8080"),
        ("unix:/tmp/x.sock", "only a host and port can be listened on, not unix: or fd://"),
        ("fd://3", "only a host and port can be listened on, not unix: or fd://"),
    ],
)
def test_anything_else_is_refused_saying_what_is_wrong(listen: str, reason: str) -> None:
    with pytest.raises(ListenError) as caught:
        listen_address(listen)
    assert str(caught.value) == f"cannot listen on {listen or repr('')}: {reason}{HINT}"


def test_a_port_of_thousands_of_digits_is_out_of_range() -> None:
    with pytest.raises(ListenError, match="is out of range"):
        listen_address("127.0.0.1:" + "9" * 5000)


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_check_config_help_is_help_not_a_file_name(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["check-config", flag])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: llamaswap check-config PATH\n")
    assert "problem" in out


def test_help_names_every_subcommand(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps the usage to the terminal
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    usage = out[: out.index("\n\n")]
    assert usage.endswith(
        "\n       llamaswap quickstart | check-config | import-config | simulate | gateway ... "
        "(each takes --help)"
    )
    assert usage.startswith("usage: llamaswap [-h] [--version] --config PATH")
    out = " ".join(out.split())
    for command in (
        "llamaswap quickstart",
        "llamaswap check-config",
        "llamaswap import-config",
        "llamaswap simulate",
        "llamaswap gateway",
    ):
        assert command in out


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        # llama-swap users' word for it, --help included: an error, not the main help
        (
            ["migrate", "--help"],
            "; to translate a llama-swap config, run: llamaswap import-config FILE -o config.toml",
        ),
        (
            ["migrate", "my config.yaml"],
            "; to translate a llama-swap config, run: "
            "llamaswap import-config 'my config.yaml' -o config.toml",
        ),
        (["check"], "; did you mean 'check-config'?"),
        (["serve", "--config", "config.toml"], ""),
    ],
)
def test_an_unknown_command_is_an_error_naming_the_commands(
    args: list[str], hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"llamaswap: unknown command {args[0]!r}{hint}",
        "llamaswap's commands are quickstart, check-config, import-config, simulate, gateway "
        "(each takes --help); "
        "it serves with: llamaswap --config PATH",
    ]


def test_the_main_form_still_takes_its_options_first(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--config", "/no/such/config.toml"])
    assert exited.value.code == 2
    assert "cannot read the file" in capsys.readouterr().err


def test_quickstart_prints_the_bundled_config(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["quickstart", "--print-config"])
    assert exited.value.code == 0
    printed = capsys.readouterr().out
    assert printed == Path(QUICKSTART_CONFIG).read_text(encoding="utf-8")
    assert "${PYTHON} -m llamaswap.fake_server" in printed  # whatever python is on PATH


def test_quickstart_takes_the_servers_options(capsys: pytest.CaptureFixture[str]) -> None:
    # A bad --listen is refused as the server refuses it: the options reach run().
    with pytest.raises(SystemExit) as exited:
        main(["quickstart", "--listen", "127.0.0.1:99999"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith("llamaswap: cannot listen on 127.0.0.1:99999: ")
    with pytest.raises(SystemExit) as exited:
        main(["quickstart", "--tls-cert", "cert.pem"])
    assert exited.value.code == 2
    assert "--tls-cert and --tls-key go together" in capsys.readouterr().err


def test_the_checkouts_quickstart_example_is_the_bundled_one() -> None:
    """examples/quickstart.toml (README, scripts/quickstart) cannot drift from the file the
    wheel carries: it is a link to it."""
    example = Path(__file__).parents[2] / "examples" / "quickstart.toml"
    assert example.resolve() == Path(QUICKSTART_CONFIG).resolve()
