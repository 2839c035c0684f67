"""README "Inference and serving" driven as a user would (stop 44): the first steps off
the documented path (a second `jaxcore serve` on the same port, Ctrl-C while it loads, a
`config=` / `--config` that is not the weights' config, a mistyped weights path) stop
with one line that says what to do."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import threading
import urllib.request

import pytest
import uvicorn

import inference.server as server_mod
import jaxcore as jc
from inference import LLM, ServingConfig, save_safetensors
from inference.engine import SlotEngine
from inference.weights import init_params
from jaxcore.models import TransformerConfig

TINY = TransformerConfig(
    vocab_size=32, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=16
)


@pytest.fixture(scope="module")
def params():
    return init_params(TINY, 0)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("jaxcore serve: "), err
    return err[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_on_a_taken_port_says_so_before_loading_the_model(monkeypatch, capsys):
    # A second `jaxcore serve --port 8000` loaded and compiled the whole model, logged
    # "serving ... on http://127.0.0.1:8000/v1", and only then died of uvicorn's
    # "[Errno 98] address already in use" (exit 3). vLLM binds its port before it loads
    # the engine; so does jaxcore serve now, and says so in one line.
    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the port was checked")

    monkeypatch.setattr(server_mod, "LLM", no_load)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert server_mod.main(["--model", "tiny", "--port", str(port)]) == 2
    line = _one_line(capsys)
    assert f"127.0.0.1:{port}" in line and "--port" in line


@pytest.mark.parametrize("where", ["loading", "compiling"])
def test_ctrl_c_while_the_server_loads_is_one_line(params, tmp_path, monkeypatch, capsys, where):
    # Ctrl-C during the load or the bucket compiles printed a 30-line KeyboardInterrupt
    # traceback ending in XLA's compiler; as `jaxcore run` / `jaxcore rlhf`, it is one line
    # and exit 130, the model is closed and the port is free again.
    path = save_safetensors(tmp_path / "model.safetensors", TINY, params)
    closed = []

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    if where == "loading":
        monkeypatch.setattr(server_mod, "LLM", interrupt)
    else:
        monkeypatch.setattr(SlotEngine, "warmup", interrupt)
        monkeypatch.setattr(LLM, "close", lambda self: closed.append(self))
    port = _free_port()
    try:
        code = server_mod.main(["--model", str(path), "--port", str(port)])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped jaxcore serve as a traceback")
    assert code == 130
    line = _one_line(capsys)
    assert "interrupted" in line and "Ctrl-C" in line
    assert len(closed) == (where == "compiling")
    with socket.socket() as again:  # the listening socket was closed
        again.bind(("127.0.0.1", port))


@pytest.mark.parametrize(
    "change", [{"n_layers": 2}, {"d_model": 32}, {"n_heads": 4}, {"vocab_size": 48}, {"d_ff": 64}]
)
def test_a_config_that_does_not_fit_the_weights_names_the_parameter(params, change):
    # LLM(params, config=...) with another size than the weights was taken: a d_ff off
    # served anyway, n_layers off was a pytree ValueError of pjit's out_shardings, and
    # d_model / n_heads / vocab_size off failed each request in its prefill ("mul got
    # incompatible shapes for broadcasting").
    cfg = dataclasses.replace(TINY, **change)
    with pytest.raises(jc.ConfigError) as err:
        LLM(params, config=cfg)
    message = str(err.value)
    assert "do not fit" in message and "shape" in message
    assert any(f"'{key}'" in message for key in params), message
    name, value = next(iter(change.items()))
    assert f"{name}={value}" in message


def test_a_config_beside_a_file_that_carries_its_own_says_to_drop_it(params, tmp_path):
    path = save_safetensors(tmp_path / "model.safetensors", TINY, params)
    with pytest.raises(jc.ConfigError) as err:
        LLM(str(path), config=dataclasses.replace(TINY, d_model=32))
    message = str(err.value)
    assert str(path) in message and "drop config=" in message
    assert LLM(str(path), config=TINY).config == TINY  # the same config still passes


def test_serve_config_of_another_size_is_one_line(params, tmp_path, capsys):
    # an export_checkpoint-style file (no config in it) with a --config of another model
    path = jc.save_params(params, tmp_path / "model.safetensors")
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps(dataclasses.asdict(dataclasses.replace(TINY, n_layers=2))))
    argv = ["--model", str(path), "--config", str(config), "--port", str(_free_port())]
    assert server_mod.main(argv) == 2
    line = _one_line(capsys)
    assert "do not fit" in line and "n_layers=2" in line


def test_a_mistyped_weights_path_is_not_called_a_hub_name(tmp_path, monkeypatch):
    # LLM("out/model.safetensors") in a directory without out/ said "It looks like a
    # Hugging Face Hub name ... snapshot_download('out/model.safetensors')".
    monkeypatch.chdir(tmp_path)
    for spec in ["out/model.safetensors", "out/"]:
        with pytest.raises(jc.ConfigError) as err:
            LLM(spec)
        message = str(err.value)
        assert "does not exist" in message and "snapshot_download" not in message, message
    with pytest.raises(jc.ConfigError, match=r"snapshot_download\('org/model'\)"):
        LLM("org/model")


def test_ctrl_c_while_serving_stops_cleanly(params, tmp_path, monkeypatch, capsys):
    # jaxcore serve now binds its own socket and runs uvicorn.Server itself; uvicorn
    # re-raises the Ctrl-C it shut down on, which uvicorn.run swallowed: exit 0, no
    # traceback, the model closed. A real SIGINT once /health answers.
    path = save_safetensors(tmp_path / "model.safetensors", TINY, params)
    monkeypatch.setattr(SlotEngine, "warmup", lambda self: None)  # nothing is generated
    # uvicorn's dictConfig shuts every logging handler down, and absl's closes its stream:
    # pytest's captured stderr here (a terminal's stderr is left open)
    monkeypatch.setattr(uvicorn.Config, "configure_logging", lambda self: None)
    closed = []
    close = LLM.close
    monkeypatch.setattr(LLM, "close", lambda self: (closed.append(self), close(self)))
    port = _free_port()
    answered, returned = [], threading.Event()

    def interrupt_when_up():  # only a serving main() is interrupted, never pytest itself
        while not returned.is_set():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    answered.append(r.status)
            except OSError:
                returned.wait(0.05)
                continue
            os.kill(os.getpid(), signal.SIGINT)
            return

    thread = threading.Thread(target=interrupt_when_up)
    thread.start()
    try:
        code = server_mod.main(["--model", str(path), "--port", str(port), "--slots", "1"])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C while serving escaped jaxcore serve as a traceback")
    finally:
        returned.set()
        thread.join()
    assert answered == [200] and code == 0 and len(closed) == 1
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "given, hint",
    [
        ({"slot": 16}, "did you mean 'slots'?"),
        ({"quantise": "int8"}, "did you mean 'quantize'?"),
        ({"max_model_len": 64}, "max_len"),  # vLLM's names for the same settings
        ({"tensor_parallel_size": 2}, "parallel=jc.ParallelConfig(tensor=2"),
        ({"max_num_seqs": 4}, "slots"),
        ({"enable_prefix_caching": False}, "prefix_caching"),
    ],
)
def test_a_mistyped_serving_setting_says_which_was_meant(given, hint):
    # ServingConfig(slot=16) was Python's TypeError; ParallelConfig and SamplingParams
    # already answered a ConfigError naming the setting meant.
    with pytest.raises(jc.ConfigError) as err:
        ServingConfig(**given)
    message = str(err.value)
    assert f"{next(iter(given))!r} is not a setting of inference.ServingConfig" in message
    assert hint in message
    with pytest.raises(jc.ConfigError, match="did you mean 'slots'"):
        dataclasses.replace(ServingConfig(), slot=2)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--port", "70000"], ["--port 70000", "0-65535"]),  # was an OverflowError traceback
        (["--host", "192.0.2.1", "--port", "0"], ["192.0.2.1", "--host"]),  # not this machine's
    ],
)
def test_a_port_or_host_that_cannot_be_listened_on_is_one_line(argv, words, monkeypatch, capsys):
    monkeypatch.setattr(server_mod, "LLM", lambda *a, **k: pytest.fail("loaded the model"))
    assert server_mod.main(["--model", "tiny", *argv]) == 2
    line = _one_line(capsys)
    assert all(word in line for word in words), line
    assert "another jaxcore serve" not in line  # the hint of a port in use only


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--max-tokens-limit", "0"),  # was taken as "no limit"
        ("--max-tokens-limit", "-5"),  # every request got "ask for at most -5"
        ("--max-request-bytes", "0"),  # every request got a 413
        ("--max-sequences-per-request", "0"),  # a ValueError traceback after the compile
        ("--queue-size", "0"),
    ],
)
def test_a_server_limit_below_one_is_refused_before_loading(flag, value, monkeypatch, capsys):
    monkeypatch.setattr(server_mod, "LLM", lambda *a, **k: pytest.fail("loaded the model"))
    assert server_mod.main(["--model", "tiny", "--port", "0", flag, value]) == 2
    line = _one_line(capsys)
    assert f"{flag} {value}" in line and ">= 1" in line, line


@pytest.mark.parametrize(
    "limit", [{"max_tokens_limit": 0}, {"max_request_bytes": -1}, {"max_sequences_per_request": 0}]
)
def test_create_app_refuses_a_limit_below_one(params, limit):
    llm = LLM(params, config=TINY, engine=ServingConfig(slots=1))
    try:
        with pytest.raises(jc.ConfigError, match=f"{next(iter(limit))}="):
            server_mod.OpenAIServer(llm, **limit)
    finally:
        llm.close()


def test_an_unknown_log_level_is_a_usage_error(capsys):
    # `--log-level verbose` was logging's "ValueError: Unknown level" traceback
    with pytest.raises(SystemExit) as stop:
        server_mod.main(["--model", "tiny", "--log-level", "verbose"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--log-level" in err and "'verbose'" in err and "Traceback" not in err
    # uvicorn's own "trace" level was logging's ValueError too
    assert server_mod.main(["--model", "tiny", "--log-level", "TRACE", "--port", "70000"]) == 2
    assert "Traceback" not in capsys.readouterr().err
    assert server_mod._parser().parse_args(["--model", "m", "--log-level", "DEBUG"]).log_level == (
        "debug"
    )


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_calibration_without_smoothquant_is_refused_not_ignored(params, quantize):
    # `calibration=[texts]` calibrates SmoothQuant scales ("int8-smooth" only): with plain
    # int8 (or none) it was silently dropped, so the user believed the model was smoothed.
    with pytest.raises(jc.ConfigError) as err:
        LLM(params, config=TINY, engine=ServingConfig(quantize=quantize), calibration=["x"])
    message = str(err.value)
    assert "int8-smooth" in message and f"quantize={quantize!r}" in message
