"""Child-process entry point of ``bertlint --verify`` (run as a file, so that the import environment is the
script's own):

    python .../bertlint/verify/_runner.py CONFIG.json -- SCRIPT [ARGS...]

The run's ``sys.path`` is ``python SCRIPT``'s: the script's folder first, then the interpreter's own entries (this
file's folder is removed; neither bertlint's root nor the working directory is added). The runner installs the
hooks and the sandbox, runs the script as ``__main__`` (``runpy.run_path``), writes the record of what happened to
``<record_dir>/rec-<role><rank>-<pid>.json`` (incrementally while the run goes, and a final one whatever the
outcome), then returns: the interpreter shuts down normally (the script's ``atexit`` handlers run, its files are
flushed). A watchdog thread enforces the deadline (a final record is written even when the script is stuck or
swallows the stop) and ends the process group when bertlint itself is gone.

Processes the script starts with ``torch.multiprocessing`` run ``spawned_worker`` (installed by the hooks): each
one records, is bounded and stops like the main process.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
ROOT_ADDED = False  # bertlint is not installed: its root had to be put on sys.path to import it


def _default(o):
    try:
        return float(o)
    except Exception:
        return repr(o)


class RecordWriter:
    def __init__(self, record_dir: str, name: str) -> None:
        self.path = os.path.join(record_dir, f"rec-{name}.json")
        self.lock = threading.Lock()
        self.final_written = False

    def write(self, rec, final: bool) -> None:
        with self.lock:
            if self.final_written:
                return
            data = None
            for _ in range(3):  # the watchdog may read while the main thread appends
                try:
                    data = rec.to_json()
                    break
                except RuntimeError:
                    time.sleep(0.01)
            if data is None:
                data = {"rank": rec.rank, "role": rec.role, "status": "record-error", "pid": os.getpid()}
            data["final"] = final
            tmp = self.path + f".tmp{threading.get_ident()}"
            with open(tmp, "w") as f:
                json.dump(data, f, default=_default)
            os.replace(tmp, self.path)
            self.final_written = final
            if final:  # a small marker the parent polls for (it does not parse the record every 0.1 s)
                with open(self.path + ".final", "w"):
                    pass


def _start_watchdog(rec, cfg: dict, done: threading.Event) -> None:
    deadline = float(cfg.get("deadline") or 0)
    parent = int(cfg.get("parent_pid") or 0)
    ppid0 = os.getppid()

    def parent_gone() -> bool:
        if os.getppid() != ppid0:
            return True
        if parent:
            try:
                os.kill(parent, 0)
            except ProcessLookupError:
                return True
            except Exception:
                return False
        return False

    def loop():
        wrote = False
        while not done.wait(0.25):
            if parent_gone():  # bertlint was killed: nothing of the run may outlive it
                try:
                    os.killpg(os.getpgid(0), signal.SIGKILL)
                except Exception:
                    os._exit(1)
            if deadline and not wrote and time.time() > deadline + 1.0:
                # the script did not stop at the deadline (stuck in one call, or it swallowed the stop):
                # keep what was recorded; the parent ends the process group
                wrote = True
                try:
                    if rec.status == "running":
                        rec.status, rec.stop_reason = "stopped", "timeout"
                    rec.writer(True)
                except Exception:
                    pass

    threading.Thread(target=loop, name="bertlint-verify-watchdog", daemon=True).start()


def _run(rec, thunk, VerifyStop, torch):
    """Run the script (or a worker function) and record the outcome; returns the exception to re-raise, if any."""
    try:
        thunk()
        rec.finish("completed")
    except VerifyStop as e:
        rec.finish("stopped", e.reason)
    except SystemExit as e:
        if e.code in (None, 0):
            rec.finish("completed", "sys.exit")
        else:
            rec.record_crash(e)
            return e
    except BaseException as e:  # noqa: BLE001 - the user's script may raise anything
        oom = isinstance(e, getattr(torch, "OutOfMemoryError", ())) or "out of memory" in str(e).lower()
        try:
            rec.record_crash(e, oom=oom)
        except BaseException:
            rec.crash = {"type": type(e).__name__, "message": str(e)[:2000], "user_frame": None, "oom": oom}
            rec.status = "crashed"
        return e
    return None


def _setup(cfg: dict, name: str):
    import torch

    from bertlint.verify import _hooks
    from bertlint.verify._sandbox import Sandbox

    temp_before = None
    try:
        with open(cfg["temp_snapshot"]) as f:
            temp_before = json.load(f)
    except Exception:
        pass
    rec = _hooks._ACTIVE
    if rec is not None:  # forked from an instrumented process
        rec.reset_for_worker(cfg)
    else:
        rec = _hooks.Recorder(cfg)
        rec.sandbox = Sandbox(cfg["sandbox"], temp_before) if cfg.get("sandbox") else None
        rec.install()
        _hooks._ACTIVE = rec
    writer = RecordWriter(cfg["record_dir"], name)
    rec.writer = lambda final: writer.write(rec, final)
    done = threading.Event()
    _start_watchdog(rec, cfg, done)
    return torch, _hooks, rec, done


def main(argv: list[str]) -> int:
    if "--" not in argv or len(argv) < 3:
        print("usage: python -m bertlint.verify._runner CONFIG.json -- SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    cfg_path = argv[0]
    sep = argv.index("--")
    script, args = argv[sep + 1], argv[sep + 2:]
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["script"] = script
    rank = os.environ.get("RANK", "0") or "0"
    name = f"main{rank}-{os.getpid()}"
    try:
        torch, _hooks, rec, done = _setup(dict(cfg, role="main"), name)
    except BaseException as e:  # torch missing or broken: say so
        writer = RecordWriter(cfg["record_dir"], name)
        with open(writer.path, "w") as f:
            json.dump({"rank": int(rank), "role": "main", "status": "no-torch", "final": True,
                       "crash": {"type": type(e).__name__, "message": str(e)}}, f)
        return 0

    def _on_term(signum, frame):
        raise _hooks.VerifyStop("terminated")

    try:
        signal.signal(signal.SIGTERM, _on_term)
    except Exception:
        pass
    sys.argv = [script, *args]
    sys.path[0:0] = [os.path.dirname(os.path.realpath(script))]  # what `python SCRIPT` puts first
    import runpy

    err = _run(rec, lambda: runpy.run_path(script, run_name="__main__"), _hooks.VerifyStop, torch)
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except Exception:
        pass
    rec.mem.uninstall()
    rec.write_record(final=True)
    done.set()
    del err
    sys.stdout.flush()
    sys.stderr.flush()
    return 0


def spawned_worker(fn, cfg: dict, i: int, *args):
    """The function torch.multiprocessing runs in each worker the script starts: instrumented like the main
    process; the worker's own exception is re-raised after the record is written (spawn reports it as usual)."""
    cfg = dict(cfg, rank=i, role="spawn")
    torch, _hooks, rec, done = _setup(cfg, f"spawn{i}-{os.getpid()}")
    err = _run(rec, lambda: fn(i, *args), _hooks.VerifyStop, torch)
    rec.mem.uninstall()
    rec.write_record(final=True)
    done.set()
    if err is not None:
        raise err


def process_worker(cfg: dict, i: int, proc) -> None:
    """``run`` of a ``multiprocessing.Process`` the script started (``_hooks.Recorder._patch_process``): the class's
    own ``run`` (the target, or the subclass's method) under a recorder of its own — bounded like the main process,
    its record written — then the worker returns (its exception, if any, is re-raised: multiprocessing reports it
    as usual and sets the exit code)."""
    cfg = dict(cfg, rank=i, role="spawn")
    if cfg.get("world_size") is None:
        cfg["world_size"] = int(os.environ.get("WORLD_SIZE", "1") or 1)
    torch, _hooks, rec, done = _setup(cfg, f"spawn{i}-{os.getpid()}")
    err = _run(rec, lambda: type(proc).run(proc), _hooks.VerifyStop, torch)
    rec.mem.uninstall()
    rec.write_record(final=True)
    done.set()
    if err is not None:
        raise err


def ensure_importable_in_children() -> None:
    """Spawned workers unpickle ``spawned_worker`` by name: when bertlint is not installed, its root goes at the
    end of sys.path (which the workers inherit)."""
    if ROOT_ADDED and _ROOT not in sys.path:
        sys.path.append(_ROOT)


if __name__ == "__main__":
    if sys.path and os.path.realpath(sys.path[0] or os.getcwd()) == os.path.realpath(_HERE):
        del sys.path[0]  # this file's folder is not the script's
    try:
        import bertlint.verify._runner as _me
    except ImportError:
        sys.path.insert(0, _ROOT)
        import bertlint.verify._hooks  # noqa: F401 - imported now, while bertlint's root is on sys.path
        import bertlint.verify._runner as _me
        import bertlint.verify._sandbox  # noqa: F401

        sys.path.remove(_ROOT)
        _me.ROOT_ADDED = True
    sys.exit(_me.main(sys.argv[1:]))
