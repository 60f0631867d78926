"""`trace convert --from sglang-log`: SGLang ``--log-requests`` logs, text and JSON, in the
line formats of 0.5.14 and 0.5.23 (``sglang/srt/utils/request_logger.py`` and
``utils/log_utils.py``, the same in both; the request object's fields differ). The fixture
is rendered here with SGLang's rules: ``_dataclass_to_string_truncated`` (text),
``_transform_data_for_logging`` + ``log_json`` (json), behind the ``[%Y-%m-%d %H:%M:%S] ``
prefix of ``_create_logger_with_handler``."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from tests.test_import_common import one_line_error, roundtrip
from traces.io import read_trace

#: GenerateReqInput's leading fields and a few later ones, in each version's order
#: (0.5.14: BaseReq's rid, http_worker_ipc first; 0.5.23: rid, session_id first).
FIELDS = {
    "0.5.14": ["rid", "http_worker_ipc", "text", "input_ids", "input_embeds", "image_data",
               "sampling_params", "return_logprob", "stream", "log_metrics", "modalities",
               "session_params", "lora_path", "custom_logit_processor", "bootstrap_host",
               "conversation_id", "priority", "custom_labels", "received_time"],
    "0.5.23": ["rid", "session_id", "text", "input_ids", "input_embeds", "image_data",
               "sampling_params", "watermark", "return_logprob", "stream", "log_metrics",
               "session_params", "lora_path", "custom_logit_processor", "bootstrap_host",
               "routing_key", "conversation_id", "priority", "custom_labels",
               "received_time"],
}  # fmt: skip
SYSTEM = list(range(100, 140))  # a 40-token shared system prompt
BOS = 1
T0 = 1_750_000_000.0  # unix seconds of the first arrival


def _trunc(data: Any, max_length: int) -> str:
    """SGLang's ``_dataclass_to_string_truncated`` on plain values."""
    if isinstance(data, str):
        if len(data) > max_length:
            half = max_length // 2
            return f"{data[:half]!r} ... {data[-half:]!r}"
        return repr(data)
    if isinstance(data, (list, tuple)):
        if len(data) > max_length:
            half = max_length // 2
            return str(data[:half]) + " ... " + str(data[-half:])
        return str(data)
    if isinstance(data, dict):
        return "{" + ", ".join(f"'{k}': {_trunc(v, max_length)}" for k, v in data.items()) + "}"
    return str(data)


def _transform(data: Any, max_length: int) -> Any:
    """SGLang's ``_transform_data_for_logging`` on plain values."""
    if isinstance(data, str):
        if len(data) > max_length:
            half = max_length // 2
            return data[:half] + "..." + data[-half:]
        return data
    if isinstance(data, (list, tuple)):
        items = [_transform(v, max_length) for v in data]
        if len(data) > max_length:
            half = max_length // 2
            return [*items[:half], "...", *items[-half:]]
        return items
    if isinstance(data, dict):
        return {k: _transform(v, max_length) for k, v in data.items()}
    return data


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


class Log:
    """Writes request-log lines as SGLang ``version`` does in ``fmt`` at ``level``."""

    def __init__(self, version: str, fmt: str, level: int = 3) -> None:
        self.version, self.fmt, self.level = version, fmt, level
        self.max_length = 2048 if level == 2 else 1 << 30
        self.lines: list[str] = []

    def _obj(self, fields: dict[str, Any]) -> dict[str, Any]:
        return {name: fields.get(name) for name in FIELDS[self.version]} | {
            "stream": False,
            "log_metrics": True,
        }

    def _obj_text(self, obj: dict[str, Any]) -> str:
        body = ", ".join(f"{k}={_trunc(v, self.max_length)}" for k, v in obj.items())
        return f"GenerateReqInput({body})"

    def _json(self, t: float, event: str, data: dict[str, Any]) -> str:
        payload = {"timestamp": datetime.fromtimestamp(t).isoformat(), "event": event, **data}
        return f"[{_stamp(t)}] " + json.dumps(payload, ensure_ascii=False)

    def receive(self, t: float, **fields: Any) -> None:
        obj = self._obj(fields)
        if self.fmt == "json":
            data = {"rid": obj["rid"], "obj": _transform(obj, self.max_length)}
            self.lines.append(self._json(t, "request.received", data))
        else:
            self.lines.append(f"[{_stamp(t)}] Receive: obj={self._obj_text(obj)}")

    def finish(self, t: float, out: dict[str, Any], **fields: Any) -> None:
        obj = self._obj(fields)
        if self.fmt == "json":
            data = {"rid": obj["rid"], "obj": _transform(obj, self.max_length)}
            data["out"] = _transform(out, self.max_length)
            self.lines.append(self._json(t, "request.finished", data))
        else:
            out_s = _trunc(out, self.max_length)
            self.lines.append(f"[{_stamp(t)}] Finish: obj={self._obj_text(obj)}, out={out_s}")

    def noise(self, t: float, text: str) -> None:
        self.lines.append(f"[{_stamp(t)} TP0] {text}")

    def write(self, path: Path) -> Path:
        path.write_text("".join(x + "\n" for x in self.lines))
        return path


def out_of(rid: str, prompt: int, output: list[int], sent: float, e2e: float) -> dict[str, Any]:
    meta = {"id": rid, "finish_reason": {"type": "length", "length": len(output)},
            "prompt_tokens": prompt, "weight_version": "default", "num_retractions": 0,
            "reasoning_tokens": 0, "completion_tokens": len(output), "cached_tokens": 0,
            "e2e_latency": e2e, "response_sent_to_client_ts": sent}  # fmt: skip
    return {"text": "out, with 'quotes' (and parens]", "output_ids": output, "meta_info": meta}


def write_session_log(path: Path, version: str, fmt: str) -> Path:
    """Two SGLang sessions of 2 and 3 turns (session_params: each turn sends only its new
    tokens; turn 2 of s-a starts with a BOS that SGLang strips) and two plain requests
    that share the system prompt; arrivals 1 s apart from T0, each taking 0.5 s."""
    log = Log(version, fmt)
    log.noise(T0 - 1, "Prefill batch. #new-seq: 1, #new-token: 40")
    plan: list[tuple[str, list[int], dict[str, Any] | None, int]] = [
        ("a0", [*SYSTEM, 7, 7], {"id": "s-a"}, 3),
        ("b0", [*SYSTEM, 8], {"id": "s-b"}, 2),
        ("p0", [*SYSTEM, 9, 9, 9], None, 4),
        ("a1", [21, 22], {"id": "s-a", "rid": "a0"}, 2),
        ("b1", [31], {"id": "s-b", "rid": "b0"}, 1),
        ("a2", [BOS, 23], {"id": "s-a", "rid": "a1"}, 5),
        ("p1", [*SYSTEM, 10], None, 1),
    ]
    prompts: dict[str, list[int]] = {}
    outputs: dict[str, list[int]] = {}
    for i, (rid, new, params, n_out) in enumerate(plan):
        t = T0 + i
        prompt = new
        if params is not None and "rid" in params:
            parent = params["rid"]
            prompt = prompts[parent] + outputs[parent] + (new[1:] if new[0] == BOS else new)
        prompts[rid] = prompt
        outputs[rid] = [5000 + 10 * i + k for k in range(n_out)]
        sp = None
        if params is not None:
            sp = {"id": params["id"], "rid": params.get("rid"), "offset": None,
                  "replace": None, "drop_previous_output": None}  # fmt: skip
        fields = {"rid": rid, "input_ids": new, "session_params": sp,
                  "sampling_params": {"max_new_tokens": 16, "temperature": 0.0}}  # fmt: skip
        log.receive(t, **fields)
        fields["text"] = "decoded prompt, it's 'here'"  # level >= 2 writes it after Receive
        out = out_of(rid, len(prompt), outputs[rid], sent=t + 0.5, e2e=0.5)
        log.finish(t + 0.5, out, **fields)
    log.noise(T0 + 9, "Decode batch. #running-req: 1")
    return log.write(path)


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_sessions_prompts_times_and_outputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], version: str, fmt: str
) -> None:
    src = write_session_log(tmp_path / "server.log", version, fmt)
    out = tmp_path / "log.jsonl"
    assert main(["trace", "convert", str(src), str(out), "--block-size", "16"]) == 0
    assert "7 requests, 2 sessions" in capsys.readouterr().out
    trace = read_trace(out)
    reqs = list(trace.requests)
    assert [r.rid for r in reqs] == ["a0", "b0", "p0", "a1", "b1", "a2", "p1"]
    # arrival = response_sent_to_client_ts - e2e_latency: 1 s apart
    assert [r.timestamp for r in reqs] == [0.0, 1000.0, 2000.0, 3000.0, 4000.0, 5000.0, 6000.0]
    assert trace.header.extra["arrival_source"] == (
        "meta_info.response_sent_to_client_ts - e2e_latency"
    )
    a0, _b0, _p0, a1, b1, a2, p1 = reqs
    assert a0.token_ids == [*SYSTEM, 7, 7] and p1.token_ids == [*SYSTEM, 10]
    # session turns: the parent's prompt + its output + the new tokens (a2's BOS stripped)
    assert a1.token_ids == [*SYSTEM, 7, 7, 5000, 5001, 5002, 21, 22]
    assert a2.token_ids == [*a1.token_ids, 5030, 5031, 23]
    assert b1.token_ids == [*SYSTEM, 8, 5010, 5011, 31]
    assert [r.output_length for r in reqs] == [3, 2, 4, 2, 1, 5, 1]
    assert [(r.session_id, r.turn) for r in reqs] == [
        ("s-a", 0), ("s-b", 0), (None, None), ("s-a", 1), ("s-b", 1), ("s-a", 2), (None, None)
    ]  # fmt: skip
    # think time: the gap after the previous turn finished (3 s later, it ran 0.5 s)
    assert [a1.think_time_ms, b1.think_time_ms, a2.think_time_ms] == [2500.0, 2500.0, 1500.0]
    stats = roundtrip(out, tmp_path, capsys, requests=7)
    assert stats["sessions"]["sessions"] == 2  # type: ignore[index]


def test_json_arrivals_from_request_received_ts_and_receive_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = Log("0.5.23", "json")
    for i, rid in enumerate(["x", "y"]):
        out = out_of(rid, 3, [1], sent=T0 + 10, e2e=1.0)
        out["meta_info"]["request_received_ts"] = T0 + 0.25 * i  # --enable-metrics
        log.finish(T0 + 10, out, rid=rid, input_ids=[4, 5, 6 + i], session_id="agent-1")
    src = log.write(tmp_path / "a.log")
    out_path = tmp_path / "a.jsonl"
    assert main(["trace", "convert", str(src), str(out_path), "--from", "sglang-log"]) == 0
    capsys.readouterr()
    reqs = list(read_trace(out_path).requests)
    assert [(r.timestamp, r.session_id, r.turn) for r in reqs] == [
        (0.0, "agent-1", 0), (250.0, "agent-1", 1)
    ]  # fmt: skip
    # without any *_ts: the Receive lines' ISO timestamps (microseconds)
    log = Log("0.5.14", "json")
    for i, rid in enumerate(["x", "y"]):
        log.receive(T0 + 0.125 * i, rid=rid, input_ids=[4, 5, 6])
    for rid in ("y", "x"):
        out = out_of(rid, 3, [1, 2], sent=T0, e2e=1.0)
        del out["meta_info"]["response_sent_to_client_ts"]
        log.finish(T0 + 3, out, rid=rid, input_ids=[4, 5, 6])
    log.receive(T0 + 2, rid="never-finished", input_ids=[4])
    src = log.write(tmp_path / "b.log")
    assert main(["trace", "convert", str(src), str(out_path), "--force"]) == 0
    capsys.readouterr()
    trace = read_trace(out_path)
    assert [(r.rid, r.timestamp) for r in trace.requests] == [("x", 0.0), ("y", 125.0)]
    assert trace.header.extra["arrival_source"] == "receive line timestamp"
    assert trace.header.extra["unfinished_left_out"] == 1


def _level2_truncated(tmp_path: Path) -> Path:
    log = Log("0.5.23", "text", level=2)
    log.finish(T0, out_of("r", 3000, [1], T0 + 1, 1.0), rid="r", input_ids=list(range(3000)))
    return log.write(tmp_path / "l2.log")


def _broken_repr(tmp_path: Path) -> Path:
    path = write_session_log(tmp_path / "x.log", "0.5.14", "text")
    lines = path.read_text().splitlines()
    lines[4] = lines[4].replace("input_ids=[", "input_ids=[[", 1)  # line 5: b0's Finish
    path.write_text("\n".join(lines) + "\n")
    return path


def _text_prompt(tmp_path: Path) -> Path:
    log = Log("0.5.14", "text")
    log.finish(T0, out_of("r", 3, [1], T0 + 1, 1.0), rid="r", text="hello there")
    return log.write(tmp_path / "text.log")


def _no_requests(tmp_path: Path) -> Path:
    log = Log("0.5.14", "text", level=0)
    log.noise(T0, "Prefill batch.")
    return log.write(tmp_path / "none.log")


@pytest.mark.parametrize(
    ("make", "line", "field", "says"),
    [
        (_level2_truncated, "1", "obj.input_ids", "--log-requests-level 3"),
        (_broken_repr, "5", "line", "cannot parse the logged request"),
        (_text_prompt, "1", "obj.text", "--tokenizer"),
        (_no_requests, "0", "file", "--log-requests"),
    ],
)
def test_malformed_is_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any, line: str, field: str, says: str
) -> None:
    src = make(tmp_path)
    cmd = ["trace", "convert", str(src), str(tmp_path / "o.jsonl"), "--from", "sglang-log"]
    assert main(cmd) == 2
    m = one_line_error(capsys.readouterr().err)
    assert (m["path"], m["line"], m["field"]) == (str(src), line, field)
    assert says in m["problem"]


def test_lenient_skips_the_bad_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _broken_repr(tmp_path)
    out = tmp_path / "o.jsonl"
    assert main(["trace", "convert", str(src), str(out), "--lenient"]) == 0
    assert "skipped" in capsys.readouterr().err
    # b0 is gone, so its session's next turn cannot be rebuilt either: skipped too
    assert [r.rid for r in read_trace(out).requests] == ["a0", "p0", "a1", "a2", "p1"]
