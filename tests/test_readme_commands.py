"""Every runnable ``simdist ...`` command shown in README.md runs as shown (issue 16, item 6).

Commands are taken from README.md itself:
- ``$ simdist ...`` lines of code blocks (a ``| jq ...`` tail is dropped: the command's own output is JSON);
  when the block's next line starts with ``error:`` the command must fail with exactly that one line;
- ``simdist ...`` after ``&&`` in a code block (the quick start);
- inline code spans ```simdist ...``` and ```--set ...``` fragments of a runnable command: a fragment of
  options is run after ``simdist run scenarios/default.yaml --fidelity closed_form`` and after
  ``simdist topo show dgx-h100``.
Templates (``NAME|FILE``, ``[--json]``, ``SCENARIO``, ``...``) are not runnable and are left out.

Small inputs: `SMALL_INPUTS` rewrites a command to a smaller one of the same kind, each rewrite written out
below (the README shows the published sizes; a test of that size would take minutes). A command marked
``# slow`` in the README is skipped unless ``SIMDIST_README_SLOW=1``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

SMALL_INPUTS: list[tuple[str, str]] = [
    # a layout search of GPT-3 175B on 1,024 A100 -> Llama 3 8B on one DGX H100, a smaller space
    ("--model gpt3-175b --cluster dgx-a100 --gpus 1024 --global-batch 1536",
     "--model llama3-8b --cluster dgx-h100 --gpus 8 --global-batch 16 --max-vpp 2 --max-micro-batch 2 "
     "--schedules 1f1b"),
    # an 8 GB all-reduce sweep point -> 8 MB (the same algorithm and ranks)
    ("--bytes 8G", "--bytes 8M"),
    # compare at 1,024 GPUs -> 16
    ("--gpus 1024 --tokens", "--gpus 16 --tokens"),
]
PROSE = {"simdist search --zero3-fetch": "names the flag in a sentence, without a value"}
"""Inline spans that look like commands but are prose (each with why it is not run)."""
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]{2,}\b|\[|\.\.\.|[A-Za-z0-9]\|[A-Za-z]")


def _commands() -> list[tuple[str, str | None]]:
    """(command, expected error line or None), in README order."""
    text = README.read_text(encoding="utf-8")
    out: list[tuple[str, str | None]] = []
    in_block = False
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("```"):
            in_block = not in_block
            continue
        if in_block:
            if line.startswith("$ simdist "):
                nxt = lines[i + 1] if i + 1 < len(lines) else ""
                out.append((line[2:].split(" | ")[0].strip(), nxt if nxt.startswith("error:") else None))
            elif "&& simdist " in line:
                out.append(("simdist " + line.split("&& simdist ", 1)[1].strip(), None))
            continue
        for span in re.findall(r"`([^`]+)`", line):
            if (span.startswith("simdist ") and len(span.split()) > 2 and not PLACEHOLDER.search(span)
                    and span not in PROSE):
                out.append((span, None))
            elif span.startswith("--set ") and not PLACEHOLDER.search(span):
                out.append(("simdist run scenarios/default.yaml --fidelity closed_form " + span, None))
                out.append(("simdist topo show dgx-h100 " + span, None))
    return list(dict.fromkeys(out))


COMMANDS = _commands()


def test_the_readme_shows_runnable_commands():
    assert len(COMMANDS) >= 6  # the extraction finds them (a README reshuffle must not silently test nothing)
    assert any(c.startswith("simdist run ") for c, _ in COMMANDS)
    assert any(e is not None for _, e in COMMANDS)


def _small(command: str) -> str:
    for old, new in SMALL_INPUTS:
        command = command.replace(old, new)
    return command


@pytest.mark.parametrize(("command", "error"), COMMANDS, ids=[c for c, _ in COMMANDS])
def test_readme_command_runs(command, error, cli, tmp_path, monkeypatch):
    if "# slow" in command and os.environ.get("SIMDIST_README_SLOW") != "1":
        pytest.skip("marked slow in README.md (SIMDIST_README_SLOW=1 runs it)")
    monkeypatch.chdir(REPO)
    argv = shlex.split(_small(command.split("# ")[0]))[1:]
    for flag in ("--out", "--html"):  # files the README writes go to a temporary folder
        if flag in argv:
            k = argv.index(flag) + 1
            argv[k] = str(tmp_path / Path(argv[k]).name)
    code, out, err = cli(*argv)
    if error is not None:
        assert code == 2 and err.strip().splitlines()[-1] == error, err
        return
    assert code == 0, f"{command}: {err}"
    if "--json" in argv:
        json.loads(out)
