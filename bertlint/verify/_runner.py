"""Child-process entry point of ``bertlint --verify``:

    python -m bertlint.verify._runner CONFIG.json -- SCRIPT [ARGS...]

Installs the hooks, runs the script as ``__main__`` (``runpy.run_path``), and writes the record of what happened to
``<record_dir>/rank<RANK>.json`` whatever the outcome (bound reached, script finished, crash, out of memory,
timeout). Exits with 0 once the record is written; the parent reads the record, not the exit code.
"""

from __future__ import annotations

import json
import os
import signal
import sys


def _write(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, default=_default)
    os.replace(tmp, path)


def _default(o):
    try:
        return float(o)
    except Exception:
        return repr(o)


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
    out = os.path.join(cfg["record_dir"], f"rank{rank}.json")
    try:
        import torch  # noqa: F401

        from bertlint.verify._hooks import Recorder, VerifyStop
    except BaseException as e:  # torch missing or broken: say so
        _write(out, {"rank": int(rank), "status": "no-torch", "crash": {"type": type(e).__name__, "message": str(e)}})
        return 0
    rec = Recorder(cfg)
    rec.install()

    def _on_term(signum, frame):
        raise VerifyStop("timeout")

    try:
        signal.signal(signal.SIGTERM, _on_term)
    except Exception:
        pass
    sys.argv = [script, *args]
    sys.path[0:0] = [os.path.dirname(os.path.abspath(script))]
    import runpy

    try:
        runpy.run_path(script, run_name="__main__")
        rec.finish("completed")
    except VerifyStop as e:
        rec.finish("stopped", e.reason)
    except SystemExit as e:
        code = e.code
        if code in (None, 0):
            rec.finish("completed", "sys.exit")
        else:
            rec.record_crash(e)
    except KeyboardInterrupt as e:
        rec.record_crash(e)
    except BaseException as e:  # noqa: BLE001 - the user's script may raise anything
        oom = isinstance(e, getattr(torch, "OutOfMemoryError", ())) or "out of memory" in str(e).lower()
        try:
            rec.record_crash(e, oom=oom)
        except BaseException:
            rec.crash = {"type": type(e).__name__, "message": str(e)[:2000], "user_frame": None, "oom": oom}
            rec.status = "crashed"
    try:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except Exception:
        pass
    try:
        data = rec.to_json()
    except BaseException as e:
        data = {"rank": int(rank), "status": "record-error", "crash": {"type": type(e).__name__, "message": str(e)}}
    _write(out, data)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
