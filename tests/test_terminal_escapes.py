"""Users' strings never reach the terminal raw (issue 35): ESC/OSC sequences, carriage returns and bidi overrides in
scenario names, file names and field values come out as \\uXXXX escapes on stdout and stderr, in text and JSON."""

from __future__ import annotations

import json

import yaml

from simdist.cli.streams import terminal_safe
from tests.cli_harness import run_cli

HOSTILE = "\x1b]8;;http://evil.example\x1b\\click\x1b]8;;\x1b\\ \x1b[2J\r\u202egnp.exe\u2066x\u2069\x9b31m"
RAW = ("\x1b", "\r", "\u202e", "\u2066", "\u2069", "\x9b")


def _clean(text: str) -> bool:
    return not any(c in text for c in RAW)


def test_terminal_safe_escapes_and_keeps_newlines():
    assert terminal_safe("a\tb\nc\x1b[0m\u202e") == "a\tb\nc\\u001b[0m\\u202e"
    # in JSON the escape means the same character: a reader gets the user's string back
    doc = json.loads(terminal_safe(json.dumps({"name": "x\u202ey"}, ensure_ascii=False)))
    assert doc["name"] == "x\u202ey"


def test_a_hostile_scenario_name_is_escaped_in_text_and_json(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": HOSTILE, "cluster": {"preset": "dgx-h100"},
        "model": {"num_layers": 2, "hidden_size": 1024, "num_attention_heads": 8, "seq_length": 512,
                  "vocab_size": 32000},
        "parallel": {"tp": 8}, "training": {"micro_batch_size": 1, "global_batch_size": 1}}, allow_unicode=True))
    text = run_cli(["run", str(path), "--fidelity", "closed_form"])
    assert text.code == 0, text.err
    assert _clean(text.out) and _clean(text.err) and "\\u001b]8;;http" in text.out
    as_json = run_cli(["run", str(path), "--fidelity", "closed_form", "--json"])
    assert as_json.code == 0 and _clean(as_json.out)
    assert json.loads(as_json.out)["name"] == HOSTILE  # the JSON still carries the name itself


def test_a_hostile_file_name_and_value_in_an_error_are_escaped(tmp_path):
    bad = tmp_path / "\x1b[31mred\u202e.yaml"
    bad.write_text("name: x\ngpu: h100-sxm\ngpus_per_node: 8\nhost: {pcie: {generation: 5}}\n"
                   "inter_node: {kind: \"\x1b[5minfini\u202eband\", nics_per_node: 1, nic_bandwidth: 400 Gb/s}\n")
    r = run_cli(["topo", "show", str(bad)])
    assert r.code == 2 and _clean(r.err) and _clean(r.out), r.err
    assert "\\u001b[31mred" in r.err
