"""The console script (`simdist.cli.console`): `main`'s exit status and output, then its exit handlers, then the
process ends without the interpreter's teardown where no other thread runs."""

import io
import json
import subprocess
import sys

import pytest

import simdist.cli as cli
from tests.conftest import REPO


class Ended(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@pytest.fixture
def ending(monkeypatch):
    """os._exit replaced by an exception carrying its status; the exit handlers (this test process's own: not run)
    replaced by a record of the call; one thread, by default."""
    def _exit(code: int) -> None:
        raise Ended(code)

    monkeypatch.setattr(cli.os, "_exit", _exit)
    monkeypatch.setattr(cli.atexit, "_run_exitfuncs", lambda: HANDLERS_RAN.append(True), raising=False)
    monkeypatch.setattr(cli.threading, "active_count", lambda: 1)
    monkeypatch.setattr(cli.gc, "set_threshold", lambda *thresholds: None)  # the test process's collector stays
    HANDLERS_RAN.clear()
    return monkeypatch


HANDLERS_RAN: list[bool] = []


@pytest.mark.parametrize(("raised", "code"), [(None, 0), (SystemExit(0), 0), (SystemExit(None), 0), (SystemExit(2), 2),
                                              (SystemExit(130), 130)])
def test_console_ends_with_mains_status(ending, raised, code):
    def main() -> None:
        if raised is not None:
            raise raised

    ending.setattr(cli, "main", main)
    with pytest.raises(Ended) as ended:
        cli.console()
    assert ended.value.code == code


def test_console_prints_a_message_exit_and_ends_with_one(ending, capsys):
    def main() -> None:
        sys.exit("something went wrong")

    ending.setattr(cli, "main", main)
    with pytest.raises(Ended) as ended:
        cli.console()
    assert ended.value.code == 1
    assert "something went wrong" in capsys.readouterr().err


def test_console_runs_the_exit_handlers_before_it_ends_and_exits_as_usual_where_a_thread_waits(ending):
    ending.setattr(cli, "main", lambda: sys.exit(3))
    with pytest.raises(Ended) as ended:
        cli.console()
    assert ended.value.code == 3 and HANDLERS_RAN == [True]
    HANDLERS_RAN.clear()
    ending.setattr(cli.threading, "active_count", lambda: 2)
    with pytest.raises(SystemExit) as exited:  # the interpreter's exit: it waits for the thread, then the handlers
        cli.console()
    assert exited.value.code == 3 and HANDLERS_RAN == []


def test_an_exit_handler_runs_and_the_status_is_mains_in_a_real_process(tmp_path):
    """A real console process: the handler main registered writes its file (as the interpreter's exit would run
    it), the status is main's, and the collector ran with the console's thresholds."""
    mark = tmp_path / "ran.txt"
    code = ("import atexit, gc, sys, simdist.cli as c\n"
            f"def main():\n    atexit.register(lambda: open({str(mark)!r}, 'w').write(repr(gc.get_threshold())))\n"
            "    sys.exit(4)\n"
            "c.main = main\nc.console()\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, proc.stderr
    assert mark.read_text() == repr(cli.GC_THRESHOLDS)


def test_console_flushes_stdout_before_it_ends(ending):
    class Out(io.StringIO):
        flushed = ""

        def flush(self) -> None:  # what had reached the stream when it was flushed
            self.flushed = self.getvalue()

    out = Out()
    ending.setattr(sys, "stdout", out)
    ending.setattr(cli, "main", lambda: out.write('{"a": 1}'))  # no flush: os._exit would drop a buffer left so
    with pytest.raises(Ended):
        cli.console()
    assert out.flushed == '{"a": 1}'


def test_python_m_simdist_writes_its_whole_json_and_its_status():
    proc = subprocess.run([sys.executable, "-m", "simdist", "run", "scenarios/default.yaml", "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["step_time_s"] > 0
    bad = subprocess.run([sys.executable, "-m", "simdist", "run", "scenarios/nope.yaml", "--json"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.startswith("error: ")
