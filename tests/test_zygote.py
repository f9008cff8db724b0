"""tests/zygote.py: a forked child is the process ``python ARGS`` would have been (its
directory, environment, argv, path, descriptors, exit status, atexit handlers), and a zygote
serves only the load-time variables it started with. Zygotes here preload nothing (fast)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import zygote

SCRIPT = """
import atexit, json, os, sys
atexit.register(lambda: open(os.path.join(sys.argv[1], "atexit"), "w").write("ran"))
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
                  "marker": os.environ.get("ZYGOTE_MARKER"), "name": __name__,
                  "pid": os.getpid()}))
sys.stderr.write("to stderr\\n")
raise SystemExit(int(sys.argv[2]))
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ZYGOTE_MARKER"}
    return {**env, "PYTHONPATH": str(zygote.REPO), **extra}


def test_a_script_runs_as_main_in_its_directory_with_its_environment(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    work = tmp_path / "work"
    work.mkdir()
    done = zygote.run(
        [sys.executable, str(script), str(tmp_path), "3"],
        cwd=work,
        env=_env(ZYGOTE_MARKER="m1"),
        timeout=60,
        preload=(),
        check=False,
    )
    assert done.returncode == 3
    assert done.stderr == "to stderr\n"
    seen = __import__("json").loads(done.stdout)
    assert seen["argv"] == [str(script), str(tmp_path), "3"]
    assert seen["cwd"] == str(work)
    assert seen["path0"] == str(tmp_path)
    assert seen["marker"] == "m1"
    assert seen["name"] == "__main__"
    assert seen["pid"] != os.getpid()
    assert (tmp_path / "atexit").read_text() == "ran"


def test_a_module_runs_with_its_directory_first_on_the_path(tmp_path: Path) -> None:
    (tmp_path / "zygote_probe.py").write_text(
        "import os, sys\nprint(sys.path[0], __name__, sys.argv[1:])\n"
    )
    done = zygote.run(
        [sys.executable, "-m", "zygote_probe", "a", "b"],
        cwd=tmp_path,
        env=_env(),
        timeout=60,
        preload=(),
    )
    assert done.stdout.split() == [str(tmp_path), "__main__", "['a',", "'b']"]


def test_an_exception_exits_1_with_its_traceback_and_a_signal_is_negative(tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text("raise RuntimeError('boom')\n")
    done = zygote.run(
        [sys.executable, str(script)], cwd=tmp_path, env=_env(), timeout=60, preload=(), check=False
    )
    assert done.returncode == 1
    assert "RuntimeError: boom" in done.stderr and "Traceback" in done.stderr
    sleeper = tmp_path / "sleep.py"
    sleeper.write_text("import time\ntime.sleep(60)\n")
    child = zygote.popen([sys.executable, str(sleeper)], cwd=tmp_path, env=_env(), preload=())
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.2)
    assert child.poll() is None
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == -signal.SIGTERM


def test_children_of_one_zygote_and_a_zygote_per_load_time_value(tmp_path: Path) -> None:
    script = tmp_path / "ppid.py"
    script.write_text("import os\nprint(os.getppid(), os.environ['OMP_NUM_THREADS'])\n")

    def parent(threads: str) -> tuple[str, str]:
        out = zygote.run(
            [sys.executable, str(script)], cwd=tmp_path, env=_env(OMP_NUM_THREADS=threads),
            timeout=60, preload=(),
        ).stdout.split()  # fmt: skip
        return out[0], out[1]

    first, again, other = parent("1"), parent("1"), parent("2")
    assert first == again and first[1] == "1"
    assert other[1] == "2" and other[0] != first[0]


def test_only_python_commands_are_forked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="python SCRIPT"):
        zygote.popen(["bash", "-c", "true"], cwd=tmp_path, env=_env(), preload=())
    with pytest.raises(ValueError, match="no interpreter option"):
        zygote.popen([sys.executable, "-c", "pass"], cwd=tmp_path, env=_env(), preload=())


def test_a_preload_that_extends_a_base_is_forked_from_the_base_zygote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The extending zygote is a child of the base's, holds the base's imports and its own
    (imported under the requester's environment), and the base's keeps serving its own."""
    monkeypatch.setattr(zygote, "BASES", (("json",),))
    script = tmp_path / "probe.py"
    script.write_text(
        "import os, sys\n"
        "stat = open(f'/proc/{os.getppid()}/stat').read()\n"
        "print(os.getppid(), stat.rsplit(')', 1)[1].split()[1],\n"
        "      'json' in sys.modules, 'csv' in sys.modules, 'wave' in sys.modules)\n"
    )
    imports_wave = tmp_path / "lib"
    imports_wave.mkdir()
    (imports_wave / "sia_probe_extra.py").write_text(
        "import os, wave\nassert os.environ['ZYGOTE_MARKER'] == 'extending'\n"
    )
    env = _env(ZYGOTE_MARKER="extending")
    env["PYTHONPATH"] += os.pathsep + str(imports_wave)

    def probe(*preload: str) -> list[str]:
        done = zygote.run(
            [sys.executable, str(script)], cwd=tmp_path, env=env, timeout=60, preload=preload
        )
        return done.stdout.split()

    extending = probe("json", "csv", "sia_probe_extra")
    base = probe("json")
    assert extending[2:] == ["True", "True", "True"]
    assert base[2:] == ["True", "False", "False"]
    assert extending[1] == base[0]  # the extending zygote's parent is the base zygote
