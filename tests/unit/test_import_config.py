"""``llamaswap import-config``: llama-swap YAML → llamaswap TOML, and the YAML hint."""

from __future__ import annotations

import textwrap
from pathlib import Path

import attrs
import pytest
import tomli
from ruamel.yaml import YAML

from llamaswap.cli import main
from llamaswap.config import Capabilities, Config, loads_config
from llamaswap.config.command import check_config
from llamaswap.config.model import GroupConfig
from llamaswap.errors import ConfigError
from llamaswap.migrate.translate import ImportResult, Remark, YamlError, import_yaml
from tests.unit.ports import every_port_free

FIXTURE = Path(__file__).parent.parent / "data" / "llama-swap.yaml"
ENV = {
    "HOME": "/home/ana",
    "LLAMASWAP_KEY": "sk-from-env",
    "GPU2_KEY": "gpu2-key",
    "OPENROUTER_API_KEY": "or-key",
}


def translate(yaml: str) -> tuple[ImportResult, Config]:
    result = import_yaml(textwrap.dedent(yaml))
    return result, loads_config(result.toml, environ=ENV, free=every_port_free)


def remarks(result: ImportResult) -> list[tuple[str, bool]]:
    return [(remark.path, remark.skipped) for remark in result.remarks]


@pytest.fixture(scope="module")
def fixture() -> tuple[ImportResult, Config]:
    return translate(FIXTURE.read_text(encoding="utf-8"))


def test_the_example_config_becomes_a_valid_config_with_the_same_values(
    fixture: tuple[ImportResult, Config],
) -> None:
    _, config = fixture
    assert config.health_check_timeout == 300
    assert config.log_to_stdout.value == "both"
    assert config.log_time_format == "rfc3339"
    assert (config.start_port, config.global_ttl, config.unload_timeout) == (10001, 900, 10)
    assert config.send_loading_state is True
    assert config.api_keys == ("sk-local-1", "sk-from-env")
    assert config.macros["default_args"] == "--threads 8 --flash-attn on"

    qwen = config.models["qwen"]
    # The multi-line cmd: its comment line dropped, macros (nested, per model, env) filled.
    assert qwen.cmd[0] == "/opt/llama.cpp/build/bin/llama-server"
    assert qwen.cmd[1] == "--port"
    assert qwen.cmd[3:] == (
        "--model",
        "/home/ana/models/qwen3-8b-q4_k_m.gguf",
        "--ctx-size",
        "16384",
        "--threads",
        "8",
        "--flash-attn",
        "on",
        "--temp",
        "0.7",
    )
    assert qwen.env == {"CUDA_VISIBLE_DEVICES": "0", "GGML_CUDA_ENABLE_UNIFIED_MEMORY": "1"}
    assert (qwen.name, qwen.description, qwen.use_model_name) == (
        "Qwen3 8B",
        "general chat",
        "qwen3-8b",
    )
    assert (qwen.aliases[0], qwen.ttl, qwen.concurrency_limit) == ("gpt-4o-mini", 300, None)
    assert qwen.capabilities == Capabilities(in_=("text",), tools=True)  # as llama-swap's
    assert qwen.filters.strip_params == ("temperature", "top_p", "top_k")  # 'model' never
    assert qwen.filters.set_params == {"top_p": 0.9}
    assert qwen.filters.set_params_by_id == {
        "qwen:think": {"chat_template_kwargs": {"enable_thinking": True}}
    }
    assert config.resolve("qwen:think") == "qwen"
    assert qwen.metadata == {"family": "qwen", "context": 16384}
    assert (qwen.timeouts.connect, qwen.timeouts.response_header) == (10, 120)

    coder = config.models["coder"]
    assert coder.cmd[3:] == (
        "--model",
        "/home/ana/models/qwen2.5-coder-7b-q4_k_m.gguf",
        "--ctx-size",
        "32768",
    )
    assert coder.cmd_stop is None  # cmdStop: "" is llama-swap's "not set"
    assert coder.ttl == 900  # ttl: -1 is the global TTL
    assert (coder.unload_timeout, coder.send_loading_state) == (20, False)
    assert config.models["embed"].cmd[-3:] == (
        "--model",
        "/home/ana/models/nomic-embed-text-v1.5.gguf",
        "--embedding",
    )
    assert config.models["embed"].unlisted is True
    whisper = config.models["whisper"]
    assert (whisper.proxy, whisper.health_url) == ("http://127.0.0.1:9233", None)
    docker = config.models["docker-llama"]
    assert docker.cmd_stop == ("docker", "stop", "docker-llama")
    assert docker.cmd[-1] == "/models/Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf"

    assert config.hooks.on_startup.preload == ("embed",)
    router = config.routing.router
    assert router.use == "matrix"
    group = router.settings.groups["always-on"]
    assert (group.members, group.swap, group.exclusive, group.persistent) == (
        ("embed",),
        False,
        False,
        True,
    )
    assert router.settings.matrix is not None
    assert router.settings.matrix.vars == {
        "q": "qwen",
        "c": "coder",
        "e": "embed",
        "whisper": "whisper",  # named directly in a set: given a var
        "docker-llama": "docker-llama",
    }
    assert router.settings.matrix.evict_costs == {"docker-llama": 5}
    assert router.settings.matrix.sets["speech"] == "whisper & e"
    assert config.routing.scheduler.use == "fifo"
    assert config.routing.scheduler.settings.fifo.priority == {"qwen": 10, "embed": 5}

    gpu2, openrouter = config.peers["gpu2"], config.peers["openrouter"]
    assert (gpu2.proxy, gpu2.api_key, gpu2.models) == (
        "http://192.168.1.23:8080",
        "gpu2-key",
        ("llama-70b",),
    )
    assert openrouter.api_key == "or-key"
    assert (openrouter.timeouts.connect, openrouter.timeouts.tls_handshake) == (30, 10)
    assert openrouter.filters.strip_params == ("temperature", "top_p")
    assert openrouter.filters.set_params == {"provider": {"data_collection": "deny", "zdr": True}}


def test_what_llamaswap_has_no_key_for_is_listed_by_yaml_path_and_never_written(
    fixture: tuple[ImportResult, Config],
) -> None:
    result, _ = fixture
    assert remarks(result) == [
        ("metricsMaxInMemory", True),
        ("models.qwen.timeouts.expectContinue", True),
        ("models.docker-llama.compat", True),
        ("routing.router.settings.matrix.vars", False),  # the vars it added
    ]
    assert result.remarks[1].render() == (
        "models.qwen.timeouts.expectContinue: not translated: "
        "llamaswap has no key 'expectContinue' here"
    )
    for key in ("metricsMaxInMemory", "expectContinue", "compat"):
        assert key not in result.toml


def test_comments_stay_where_they_were(fixture: tuple[ImportResult, Config]) -> None:
    toml = fixture[0].toml
    expected = [
        # above a key, and the file's opening comments
        "# config.example.yaml (a test fixture for `llamaswap import-config`).\n\n"
        "# wait this long for a model to answer /health\nhealthCheckTimeout = 300\n",
        # between the items of an array
        '    "sk-local-1",\n    # from the environment, to keep it out of the file\n',
        # above a table's header, and above a value in it
        "# general chat, the default\n[models.qwen]\n",
        "[models.qwen.filters]\n# clients may not change these\nstripParams = [",
        # at the end of a line; an env list item's comment goes with its variable
        'CUDA_VISIBLE_DEVICES = "0" # the first GPU\n',
        "docker-llama = 5 # a container is slow to start\n",
        "# sets may name models directly\n[routing.router.settings.matrix.sets]\n",
        # a command's comment lines stay in it, macros and all (they are not filled in)
        "cmd = '''\n# ${llama-server} is defined above\n${llama-server}\n--model ",
        "[hooks.on_startup]\n# loaded when llama-swap starts\npreload = [",
    ]
    for piece in expected:
        assert piece in toml
    # A dropped key's comment goes with it.
    assert "llamaswap keeps a fixed number" not in toml


def test_legacy_top_level_matrix_moves_under_routing() -> None:
    result, config = translate(
        """
        models:
          a: {cmd: "a --port ${PORT}"}
          b: {cmd: "b --port ${PORT}"}
        matrix:
          vars: {x: a}
          sets:
            both: "x & b"
        """
    )
    assert config.routing.router.use == "matrix"
    assert config.routing.router.settings.matrix is not None
    assert config.routing.router.settings.matrix.vars == {"x": "a", "b": "b"}
    assert remarks(result) == [("matrix.vars", False)]  # at its path in the YAML file


def test_legacy_top_level_groups_move_under_routing() -> None:
    _, config = translate(
        """
        models:
          a: {cmd: "a --port ${PORT}"}
        groups:
          g: {members: [a], swap: false}
        """
    )
    assert config.routing.router.use == "group"
    assert config.routing.router.settings.groups["g"].members == ("a",)
    assert config.routing.router.settings.groups["g"].swap is False


@pytest.mark.parametrize(
    ("yaml", "key", "expected", "remark"),
    [
        ("healthCheckTimeout: 5", "healthCheckTimeout", 15, ("healthCheckTimeout", False)),
        ("unloadTimeout: 0", "unloadTimeout", None, None),
        ("logTimeFormat: ''", "logTimeFormat", "", None),  # no timestamp, as in llama-swap
        ("startPort: ~", "startPort", None, None),
        ("apiKeys: [a, ~, b]", "apiKeys", ["a", "b"], ("apiKeys[1]", True)),
        ("apiKeys: [1234567890]", "apiKeys", ["1234567890"], None),
        ("sendLoadingState: yes", "sendLoadingState", True, None),
        # llama-swap reads both without case; an unknown one as info / no timestamp
        ("logLevel: Debug", "logLevel", "debug", ("logLevel", False)),
        ("logLevel: warning", "logLevel", "info", ("logLevel", False)),
        ("logTimeFormat: RFC3339", "logTimeFormat", "rfc3339", ("logTimeFormat", False)),
        ("logTimeFormat: iso", "logTimeFormat", "", ("logTimeFormat", False)),
        ("globalTTL: 5184000", "globalTTL", 0, ("globalTTL", False)),
        # llama-swap's megabytes; 0 or less turns its captures off, as llamaswap's are
        ("captureBuffer: 15", "captureBuffer", "15MiB", ("captureBuffer", False)),
        ("captureBuffer: 0", "captureBuffer", None, None),
        ("captureBuffer: -1", "captureBuffer", None, None),
        ("captureBuffer: lots", "captureBuffer", None, ("captureBuffer", True)),
    ],
)
def test_top_level_values(
    yaml: str, key: str, expected: object, remark: tuple[str, bool] | None
) -> None:
    result = import_yaml(yaml)
    assert tomli.loads(result.toml).get(key) == expected
    assert remarks(result) == ([remark] if remark else [])


@pytest.mark.parametrize(
    ("yaml", "key", "expected"),
    [
        ("ttl: -1", "ttl", None),
        ("ttl: 0", "ttl", 0),
        ("concurrencyLimit: 0", "concurrencyLimit", None),
        ("concurrencyLimit: 4", "concurrencyLimit", 4),
        ("unloadTimeout: 0", "unloadTimeout", None),
        ("env: [A=1, B=x=y]", "env", {"A": "1", "B": "x=y"}),
        ("env: {A: '1'}", "env", {"A": "1"}),
        ("filters: {strip_params: 'a, ,b,a'}", "filters", {"stripParams": ["a", "b"]}),
        ("filters: {stripParams: 'model'}", "filters", None),
        # Split by the loader once its macros are filled in, as llama-swap splits it.
        ("filters: {stripParams: 'a, ${m}'}", "filters", {"stripParams": "a, ${m}"}),
        ("concurrencyLimit: -1", "concurrencyLimit", None),  # llama-swap's default, as 0
        ("checkEndpoint: health", "checkEndpoint", "/health"),
        ("checkEndpoint: ' none '", "checkEndpoint", "none"),
        ("ttl: 5184000", "ttl", 0),  # over llamaswap's 30 days: never unload
        # YAML 1.1 booleans, which llama-swap reads into a boolean key
        ("unlisted: on", "unlisted", True),
        ("sendLoadingState: No", "sendLoadingState", False),
        # a number or boolean in a string key: as llama-swap's YAML library writes it
        ("name: 2024", "name", "2024"),
        ("description: true", "description", "true"),
        ("aliases: [4, 3.50, 1e6]", "aliases", ["4", "3.5", "1e+06"]),
        ("useModelName: 1.0", "useModelName", "1"),
        ("cmd: 'C:\\llama\\server.exe'", "cmd", "C:\\llama\\server.exe"),
    ],
)
def test_model_values(yaml: str, key: str, expected: object) -> None:
    result = import_yaml(f"models:\n  m:\n    {yaml}\n")
    model = tomli.loads(result.toml)["models"]["m"]
    assert model.get(key) == expected


def test_a_peers_set_params_by_id_is_listed_not_written() -> None:
    result, config = translate(
        """
        peers:
          remote:
            proxy: http://remote:8080
            models: [big]
            filters:
              setParams: {top_k: 40}
              setParamsByID:
                "remote/big": {temperature: 0.2}
        """
    )
    assert config.peers["remote"].filters.set_params == {"top_k": 40}
    assert result.remarks == (
        Remark(
            "peers.remote.filters.setParamsByID",
            "llamaswap takes setParamsByID on models only; use setParams",
        ),
    )


def test_an_env_variable_set_twice_keeps_the_last_value() -> None:
    result = import_yaml("models:\n  m:\n    cmd: s\n    env: [A=1, B=2, A=3]\n")
    assert tomli.loads(result.toml)["models"]["m"]["env"] == {"B": "2", "A": "3"}
    assert result.remarks == (
        Remark("models.m.env[2]", "A is set again here; the last value is kept", skipped=False),
    )


def test_a_multi_line_string_that_a_literal_cannot_hold_is_escaped() -> None:
    result = import_yaml("macros:\n  x: \"a '''q''' \\\\\\nword\\n\"\n")
    assert tomli.loads(result.toml)["macros"]["x"] == "a '''q''' \\\nword\n"


@pytest.mark.parametrize(
    ("yaml", "message", "line"),
    [
        ("models:\n  a: [1\n", "invalid YAML: expected ',' or ']', but got '<stream end>'", 3),
        ("a: 1\na: 2\n", 'invalid YAML: found duplicate key "a"', 2),
        ("- a\n- b\n", "expected a mapping", None),
    ],
)
def test_yaml_that_cannot_be_translated(yaml: str, message: str, line: int | None) -> None:
    with pytest.raises(YamlError) as raised:
        import_yaml(yaml)
    assert str(raised.value).startswith(message)
    assert raised.value.line == line


def test_anchors_and_merge_keys_are_expanded_where_they_are_used() -> None:
    result, config = translate(
        """
        shared: &shared
          ttl: 300
          unlisted: &hidden true
        models:
          a:
            <<: *shared
            cmd: a --port ${PORT}
          b:
            cmd: b --port ${PORT}
            unlisted: *hidden
        """
    )
    assert (config.models["a"].ttl, config.models["a"].unlisted) == (300, True)
    assert config.models["b"].unlisted is True
    assert remarks(result) == [("shared", True)]


def test_a_windows_command_line_is_noted_with_the_program_llamaswap_would_run() -> None:
    result, config = translate(
        r"""
        macros:
          llama: C:\llama.cpp\llama-server.exe
        models:
          qwen:
            cmd: |
              ${llama} --port ${PORT}
              -m /models/qwen.gguf
          sd:
            cmd: 'C:\Program Files\sd\sd-server.exe --listen-port 7860'
            cmdStop: taskkill /f /t /pid ${PID}
            proxy: http://127.0.0.1:7860
          rel:
            cmd: server.bin --port ${PORT} -m models\qwen.gguf
          posix:
            cmd: |
              llama-server --port ${PORT} \
                # a comment line: C:\ here is no part of the command
                -m /models/my\ model.gguf --re 'a\.b' --stop "\n"
        """
    )
    # Backslashes outside quotes are escapes to a POSIX shell: the argv is mangled.
    assert config.models["sd"].cmd[:2] == ("C:Program", "Filessdsd-server.exe")
    assert remarks(result) == [
        ("models.qwen.cmd", False),
        ("models.sd.cmd", False),
        ("models.sd.cmdStop", False),
        ("models.rel.cmd", False),
    ]
    qwen, sd, stop, _ = (remark.message for remark in result.remarks)
    assert qwen.startswith("this looks like a Windows command line, but llamaswap runs models ")
    assert "(the program here would be 'C:llama.cppllama-server.exe')" in qwen
    assert "(the program here would be 'C:Program')" in sd
    assert stop.endswith(
        "or leave cmdStop out: llamaswap stops a model by signalling its process group"
    )


def test_unquoted_dates_are_the_text_written_as_llama_swap_reads_them() -> None:
    result, config = translate(
        """
        models:
          a:
            cmd: s --port ${PORT}
            name: 2024-05-01
            description: 2024-5-1
            aliases: [2025-01-01]
            metadata: {created: 2024-05-01, at: 2001-12-14 21:59:43.10 -5}
        """
    )
    model = config.models["a"]
    assert (model.name, model.description, model.aliases) == (
        "2024-05-01",
        "2024-5-1",
        ("2025-01-01",),
    )
    assert model.metadata == {"created": "2024-05-01", "at": "2001-12-14 21:59:43.10 -5"}
    assert remarks(result) == []


@pytest.mark.parametrize(
    ("after", "ignored"),
    [
        ("---\n", False),  # a stray '---' at the end
        ("--- # only a comment\n...\n", False),
        ("---\nmodels:\n  b: {cmd: y}\n", True),
        ("---\nmodels: [\n", True),  # never read by llama-swap, so never an error there
    ],
)
def test_only_the_first_yaml_document_is_translated_as_in_llama_swap(
    after: str, ignored: bool
) -> None:
    result, config = translate('models:\n  a: {cmd: "x --port ${PORT}"}\n' + after)
    assert list(config.models) == ["a"]
    expected = [Remark("(the documents after the first)", "", skipped=True)] if ignored else []
    assert [attrs.evolve(remark, message="") for remark in result.remarks] == expected
    if ignored:
        assert result.remarks[0].render() == (
            "(the documents after the first): not translated: llama-swap reads only the "
            "first YAML document of a file and ignores the rest; move what they hold into "
            "the first if it is meant to apply"
        )


def test_a_misspelt_key_is_left_out_with_the_key_it_may_mean() -> None:
    result = import_yaml(
        "healthCheckTimout: 30\nmodels:\n  a:\n    cmd: s\n    concurrncyLimit: 2\n    zzz: 1\n"
    )
    assert [remark.render() for remark in result.remarks] == [
        "healthCheckTimout: not translated: llamaswap has no key 'healthCheckTimout' here; "
        "did you mean 'healthCheckTimeout'? (if so, llama-swap ignored it too)",
        "models.a.concurrncyLimit: not translated: llamaswap has no key 'concurrncyLimit' "
        "here; did you mean 'concurrencyLimit'? (if so, llama-swap ignored it too)",
        "models.a.zzz: not translated: llamaswap has no key 'zzz' here",
    ]


def test_an_alias_that_is_another_models_id_is_left_out_as_it_never_applied() -> None:
    result, config = translate(
        """
        models:
          a: {cmd: "a --port ${PORT}", aliases: [b, a, 7, c]}
          b: {cmd: "b --port ${PORT}", aliases: [b]}
          "7": {cmd: "c --port ${PORT}"}
        """
    )
    # llama-swap looks a name up as a model ID first: 'b' and '7' always meant b and 7.
    assert config.models["a"].aliases == ("a", "c")
    assert config.models["b"].aliases == ("b",)  # its own ID: harmless in both
    assert remarks(result) == [("models.a.aliases[0]", True), ("models.a.aliases[2]", True)]
    assert result.remarks[0].message == (
        "'b' is the ID of models.b, which llama-swap looks up first, so this alias never "
        "applied; llamaswap refuses it"
    )


def test_a_peer_id_llamaswap_refuses_is_named_with_the_rule() -> None:
    result = import_yaml("peers:\n  lab/gpu:\n    proxy: http://gpu:8080\n    models: [m]\n")
    assert remarks(result) == [('peers."lab/gpu"', False)]
    assert "a peer ID must not be empty or contain '/' or whitespace" in (
        result.remarks[0].message
    )
    with pytest.raises(ConfigError, match="peer ID 'lab/gpu' must not"):
        loads_config(result.toml, free=every_port_free)


def test_a_model_without_cmd_is_kept_and_noted_since_llamaswap_requires_one() -> None:
    result = import_yaml(
        "models:\n  ext:\n    proxy: http://127.0.0.1:9000\n  empty:\n    cmd: ''\n"
        "groups:\n  g: {members: [ext]}\n"
    )
    # Kept, so what names it still finds it: the user decides what it becomes.
    assert tomli.loads(result.toml)["models"] == {
        "ext": {"proxy": "http://127.0.0.1:9000"},
        "empty": {},
    }
    assert remarks(result) == [("models.ext", False), ("models.empty", False)]
    assert result.remarks[0].message.startswith(
        "no cmd: llama-swap could not start this model (every request for it failed), and "
        "llamaswap requires one"
    )


def test_comfyui_auto_is_noted_for_the_limit_llama_swap_raises() -> None:
    result, config = translate(
        "models:\n  comfyui_auto:\n    cmd: python main.py --port ${PORT}\n"
    )
    assert config.models["comfyui_auto"].concurrency_limit is None  # not raised to 50
    assert remarks(result) == [("models.comfyui_auto", False)]
    assert "write concurrencyLimit = 50" in result.remarks[0].message


def test_upstream_ignore_paths_are_translated() -> None:
    result, config = translate(
        "upstream:\n  ignorePaths:\n    - '.*\\.(js|css)$'\n    - ^\\/ws$\n"
        "models:\n  m:\n    cmd: s --port ${PORT}\n"
    )
    assert config.upstream.ignore_paths == (r".*\.(js|css)$", r"^\/ws$")
    assert remarks(result) == []


# -- the command ---------------------------------------------------------------------------


# -- a YAML file where TOML is expected ------------------------------------------------------


@pytest.mark.parametrize("name", ["llama-swap.yaml", "config.yml", "config"])
def test_check_config_on_a_yaml_file_points_to_the_converter(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / name
    path.write_text("# my llama-swap\nmodels:\n  a:\n    cmd: a\n", encoding="utf-8")
    assert check_config(str(path)) == 2
    hint = (
        f"{path}: this is YAML (llama-swap's format), not TOML; translate it with: "
        f"llamaswap import-config {path} -o config.toml"
    )
    assert capsys.readouterr().err.splitlines() == [hint, "1 problem found"]


def test_serving_a_yaml_file_points_to_the_converter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("healthCheckTimeout: 60\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exited:
        main(["--config", str(path)])
    assert exited.value.code == 2
    assert f"llamaswap import-config {path} -o config.toml" in capsys.readouterr().err


def test_a_toml_syntax_error_is_still_reported_as_one() -> None:
    with pytest.raises(ConfigError) as raised:
        loads_config("a = = 1\n", file="config.toml", free=every_port_free)
    assert raised.value.problems[0].message.startswith("invalid TOML: ")


def test_the_old_strip_params_beside_strip_params_is_left_out_as_llama_swap_ignores_it() -> None:
    result, config = translate(
        """
        models:
          a:
            cmd: s --port ${PORT}
            filters:
              strip_params: "top_k"
              stripParams: "temperature, top_p"
        """
    )
    assert config.models["a"].filters.strip_params == ("temperature", "top_p")
    assert remarks(result) == [("models.a.filters.strip_params", True)]


def test_a_whole_env_value_in_a_free_form_table_is_noted_as_text_in_llamaswap() -> None:
    result = import_yaml(
        textwrap.dedent(
            """
            macros:
              base: 4
              chained: "${base}"
              direct: 4
            models:
              m:
                cmd: s --port ${PORT}
                metadata:
                  ctx: ${env.CTX}
                  quoted: "${env.CTX}"
                  n: "${chained}"
                  d: ${direct}
                filters:
                  setParams:
                    temperature: ${env.TEMP}
                    stop: ["${env.STOP}"]
            """
        )
    )
    # llama-swap puts an unquoted variable's value into the YAML text; llamaswap keeps
    # text. (Both follow a macro holding another macro to its number.)
    assert remarks(result) == [
        ("models.m.metadata.ctx", False),
        ("models.m.filters.setParams.temperature", False),
    ]
    assert "[macros] entry that holds it" in result.remarks[0].message


def test_llama_swaps_booleans_and_numbers_in_groups_and_preload() -> None:
    _, config = translate(
        """
        models:
          "2": {cmd: "s --port ${PORT}"}
        groups:
          g: {members: [2], swap: no, exclusive: off, persistent: Y}
        hooks:
          on_startup:
            preload: [2]
        """
    )
    group = config.routing.router.settings.groups["g"]
    assert (group.members, group.swap, group.exclusive, group.persistent) == (
        ("2",),
        False,
        False,
        True,
    )
    assert config.hooks.on_startup.preload == ("2",)


def test_what_llama_swap_neither_reads_nor_checks_is_left_out() -> None:
    result, config = translate(
        """
        routing:
          router:
            use: group
            settings:
              groups:
                main: {members: [qwen, embed], swap: false}
              matrix:
                vars: {q: qwen, o: old-model}
                sets: {s1: "q & o"}
        models:
          qwen: {cmd: "s --port ${PORT}", aliases: [q]}
          embed: {cmd: "s --port ${PORT}"}
        hooks:
          on_startup:
            preload: [" embed ", old-model, q, ""]
        """
    )
    assert config.routing.router.settings.matrix is None
    assert config.hooks.on_startup.preload == ("embed", "q")
    assert remarks(result) == [
        ("routing.router.settings.matrix", True),
        ("hooks.on_startup.preload[1]", True),
        ("hooks.on_startup.preload[3]", True),
    ]


def test_a_model_id_or_alias_llamaswap_refuses_is_named_with_the_rule() -> None:
    result = import_yaml('models:\n  "a ":\n    cmd: s\n    aliases: [" c", "d e"]\n')
    assert remarks(result) == [('models."a "', False), ('models."a ".aliases[0]', False)]
    assert "a model ID must not be empty" in result.remarks[0].message
    assert "an alias must not be empty" in result.remarks[1].message


def test_a_macro_in_a_key_is_noted_but_not_in_set_params_by_id() -> None:
    result = import_yaml(
        textwrap.dedent(
            """
            models:
              "${env.NAME}":
                cmd: s --port ${PORT}
                metadata: {"${env.KEY}": 1}
                filters:
                  setParamsByID: {"${MODEL_ID}:hot": {temperature: 1}}
            """
        )
    )
    assert remarks(result) == [
        ('models."${env.NAME}"', False),
        ('models."${env.NAME}".metadata."${env.KEY}"', False),
    ]
    assert "llama-swap fills in ${env.NAME} there" in result.remarks[0].message


@pytest.mark.parametrize(
    "router",
    [
        "{settings: {}}",  # sets nothing: llama-swap reads the top-level groups
        "{settings: {groups: {}}, use: ''}",
    ],
)
def test_legacy_groups_move_when_routing_router_sets_nothing(router: str) -> None:
    result, config = translate(
        f"""
        models:
          a: {{cmd: "a --port ${{PORT}}"}}
        groups:
          g: {{members: [a], swap: false}}
        routing:
          router: {router}
          scheduler: {{use: fifo}}
        """
    )
    assert config.routing.router.settings.groups["g"].swap is False
    assert remarks(result) == []


def test_empty_legacy_groups_beside_routing_router_are_no_conflict() -> None:
    result, config = translate(
        """
        models:
          a: {cmd: "a --port ${PORT}"}
        groups: {}
        routing:
          router:
            settings:
              groups:
                g: {members: [a]}
        """
    )
    assert config.routing.router.settings.groups["g"].members == ("a",)
    assert remarks(result) == []


GROUPS_AND_MATRIX = """
models:
  a: {cmd: "a --port ${PORT}"}
  b: {cmd: "b --port ${PORT}"}
  c: {cmd: "c --port ${PORT}"}
  e: {cmd: "e --port ${PORT}"}
groups:
  pair: {members: [a, b], swap: false, exclusive: true}
  solo: {members: [c]}
  # always loaded
  keep: {members: [e], swap: false, exclusive: false, persistent: true}
matrix:
  vars: {x: a, y: b, z: c, w: e}
  evict_costs: {z: 5}
  sets:
    small: "(x | y) & w"
    big: "z"
"""


def under_routing(yaml: str) -> str:
    """``yaml`` with its top-level groups and matrix moved under ``routing.router``."""
    at = yaml.index("groups:")
    settings = textwrap.indent(yaml[at:], "      ")
    return f"{yaml[:at]}routing:\n  router:\n    use: matrix\n    settings:\n{settings}"


@pytest.mark.parametrize("yaml", [GROUPS_AND_MATRIX, under_routing(GROUPS_AND_MATRIX)])
def test_groups_and_the_matrix_carry_over_unchanged(yaml: str) -> None:
    source = YAML(typ="safe").load(GROUPS_AND_MATRIX)
    result, config = translate(yaml)
    written = tomli.loads(result.toml)["routing"]["router"]
    assert written == {
        "use": "matrix",
        "settings": {"groups": source["groups"], "matrix": source["matrix"]},
    }
    assert remarks(result) == []
    settings = config.routing.router.settings
    assert settings.groups == {
        "pair": GroupConfig(("a", "b"), swap=False, exclusive=True),
        "solo": GroupConfig(("c",)),
        "keep": GroupConfig(("e",), swap=False, exclusive=False, persistent=True),
    }
    assert settings.matrix is not None
    assert (settings.matrix.vars, settings.matrix.evict_costs, settings.matrix.sets) == (
        {"x": "a", "y": "b", "z": "c", "w": "e"},
        {"z": 5},
        {"small": "(x | y) & w", "big": "z"},
    )


def advice_above(toml: str, header: str) -> list[str]:
    """The comment lines of llamaswap's own directly above the ``header`` line, or above
    the user's comments there (the paragraph that starts with ``# llamaswap:``)."""
    lines = toml.splitlines()
    end = lines.index(header)
    start = max(i for i, line in enumerate(lines[:end]) if line.startswith("# llamaswap:"))
    paragraph = lines[start:end]
    return paragraph[: paragraph.index("")] if "" in paragraph else paragraph


def test_a_comment_above_the_matrix_says_that_memory_would_replace_it() -> None:
    result, _ = translate(GROUPS_AND_MATRIX)
    assert result.toml.count("# llamaswap:") == 1  # the groups do nothing under a matrix
    advice = " ".join(
        line.removeprefix("# ")
        for line in advice_above(result.toml, "[routing.router.settings.matrix.vars]")
    )
    assert advice.startswith("llamaswap: these matrix sets say by hand which models")
    for words in (
        'memory = "8GiB"',
        '[devices.gpu0] memory = "24GiB"',
        "the fit rule",
        'the matrix can go, and use = "matrix" with it',
        "See docs/resources.md.",
    ):
        assert words in advice


def test_a_comment_above_the_groups_says_that_memory_would_replace_them() -> None:
    yaml = GROUPS_AND_MATRIX[: GROUPS_AND_MATRIX.index("matrix:")]
    yaml = yaml.replace("groups:", "# which models run together\ngroups:")
    result, _ = translate(yaml)
    toml = result.toml
    assert toml.count("# llamaswap:") == 1
    advice = advice_above(toml, "[routing.router.settings.groups.pair]")
    assert all(line.startswith("# ") and len(line) <= 88 for line in advice)
    text = " ".join(line.removeprefix("# ") for line in advice)
    assert text.startswith("llamaswap: these groups say by hand which models")
    assert "models in no group run side by side wherever they fit" in text
    assert text.endswith("See docs/resources.md.")
    # The user's comments stay, as a paragraph of their own below it.
    assert f"{advice[-1]}\n\n# which models run together\n[routing.router" in toml
    assert "# always loaded\n[routing.router.settings.groups.keep]" in toml


def test_without_groups_or_a_matrix_there_is_no_such_comment() -> None:
    result, _ = translate(
        """
        models:
          a: {cmd: "a --port ${PORT}"}
        groups: {}
        """
    )
    assert "docs/resources.md" not in result.toml


def test_llama_swaps_comments_that_llamaswap_makes_false_are_rewritten() -> None:
    # As in llama-swap's config.example.yaml.
    result, _ = translate(
        """
        # add this modeline for validation in vscode
        # yaml-language-server: $schema=https://example.org/llama-swap/config-schema.json
        models:
          a:
            cmd: "a --port ${PORT}"
            # timeouts: configure proxy connection timeouts for this model
            # - optional, defaults shown below
            # - connect: TCP dial connection timeout in seconds, default: 30 seconds
            # - keepalive: TCP connection keepalive timeout, default: 30 seconds
            # - responseHeader: time to wait for response headers, default: 0 (no timeout)
            # - tlsHandshake: TLS handshake timeout in seconds, default: 10 seconds
            # - idleConn: idle connection timeout in seconds, default: 90 seconds
            timeouts:
              connect: 30 # default: 30
        routing:
          # scheduler: how queued requests are ordered.
          # The default and only valid scheduler is "fifo"
          scheduler:
            use: fifo
        """
    )
    assert (
        "# add this modeline for validation in vscode\n"
        "# llamaswap: llama-swap's YAML schema line was here; no schema applies to TOML\n"
        "[models.a]\n"
    ) in result.toml
    assert (
        "# timeouts: configure proxy connection timeouts for this model\n"
        "# - optional, llama-swap's defaults shown below (llamaswap's: connect 10, "
        "tlsHandshake 10, responseHeader 0, idleConn 4, keepalive 0 seconds; 0: off)\n"
        "# - connect: TCP dial connection timeout in seconds, default: 30 seconds in "
        "llama-swap; llamaswap's: 10 seconds\n"
        "# - keepalive: TCP connection keepalive timeout, default: 30 seconds in llama-swap; "
        "llamaswap's: 0 (off)\n"
        # the same default in both: left as written
        "# - responseHeader: time to wait for response headers, default: 0 (no timeout)\n"
        "# - tlsHandshake: TLS handshake timeout in seconds, default: 10 seconds\n"
        "# - idleConn: idle connection timeout in seconds, default: 90 seconds in llama-swap; "
        "llamaswap's: 4 seconds\n"
        "[models.a.timeouts]\nconnect = 30 # default: 30\n"  # not llama-swap's wording
    ) in result.toml
    assert (
        "# scheduler: how queued requests are ordered.\n"
        '# llamaswap: the default scheduler is "fifo"; "serial" orders by priority too\n'
        "[routing.scheduler]\n"
    ) in result.toml


def test_profiles_and_selectors_carry_over_in_both_profile_forms() -> None:
    result, config = translate(
        """
        models:
          coder: {cmd: "server --port ${PORT}"}
          architect: {cmd: "server --port ${PORT}", aliases: [plan]}
        selectors:
          coding:
            strategy: spillover
            targets: [coder, plan]
            settings: {spillover: 4}
            name: "Coding"
            metadata: {purpose: coding}
        profiles:
          work:
            description: "day time"
            pins: {llm: coding, image-gen: ~}
          # the older form: models that run together
          aider: [coder, plan, ghost]
        """
    )
    assert config.selectors["coding"].strategy == "spillover"
    assert config.selectors["coding"].targets == ("coder", "plan")
    assert config.selectors["coding"].settings.spillover == 4
    assert config.selectors["coding"].metadata == {"purpose": "coding"}
    assert config.profiles["work"].description == "day time"
    assert config.profiles["work"].pins == {"llm": "coding", "image-gen": ""}
    # An alias is written as its model's ID; a name of no model is left out, as llama-swap
    # leaves it out of what it starts.
    assert config.profiles["aider"].members == ("coder", "architect")
    assert (
        '# the older form: models that run together\n[profiles.aider]\nmembers = ["coder", '
        '"architect"]\n'
    ) in result.toml
    assert remarks(result) == [("profiles.aider[1]", False), ("profiles.aider[2]", True)]
    assert result.remarks[0].message == "'plan' is an alias: the profile lists its model's ID"
