"""One measurement in its own process: ``python -m kiln.tune.worker`` reads a request (JSON) on stdin and
prints ``[status, median_s, spread_s, detail]`` as JSON.  A crash or hang here costs only this process."""
import json
import sys
import traceback

from kiln.tune.measure import run_child


def main() -> None:
    request = json.loads(sys.stdin.read())
    try:
        result = run_child(request)
    except Exception:  # noqa: BLE001 - reported to the parent as a crash
        result = ("crash", None, None, traceback.format_exc()[-2000:])
    print(json.dumps(list(result)))


if __name__ == "__main__":
    main()
