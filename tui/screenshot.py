"""Take the README's screenshot from a real run: the app, headless, queues two profiles on the CPU backend (tiny
experiment), runs them in child processes, waits for both to finish and saves an SVG.

    python -m memlab.tui.screenshot                      # -> docs/tui.svg
    python -m memlab.tui.screenshot --out /tmp/tui.svg --steps 40 --size 120x36 --profiles baseline,gradcp
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def take(out: Path, profiles: list[str], steps: int, size: tuple[int, int], device: str = "cpu", experiment: str = "tiny", timeout_s: float = 600.0) -> Path:
    from memlab.tui.app import MemlabApp
    from memlab.tui.widgets.profile_list import ProfileList

    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    here = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="memlab-screenshot-") as tmp:
        os.chdir(tmp)  # runs land in ./runs: a short path on screen, and only these runs in the results
        try:
            app = MemlabApp(runs_dir="runs", experiment=experiment, device=device, overrides=[f"train.steps={steps}"])
            failure: list[str] = []

            async def pilot_script(pilot) -> None:
                try:
                    deadline = time.monotonic() + timeout_s
                    while app.main is None:
                        await pilot.pause(0.05)
                    plist = app.main.query_one(ProfileList)
                    for name in profiles:
                        plist.post_message(ProfileList.Picked(name))
                    await pilot.pause(0.2)
                    await pilot.press("r")
                    while not (all(i.done for i in app.queue.items()) and app.results.row_count == len(profiles)):
                        if time.monotonic() > deadline:
                            failure.append(f"runs did not finish within {timeout_s:.0f} s")
                            break
                        await pilot.pause(0.2)
                    await pilot.pause(0.5)
                    bad = [(i.profile, i.status) for i in app.queue.items() if i.status != "finished"]
                    if bad:
                        failure.append(f"not finished: {bad}")
                    app.clear_notifications()
                    app.main.query_one(ProfileList).focus()
                    await pilot.pause(0.3)
                    app.save_screenshot(filename=out.name, path=str(out.parent))
                finally:
                    await app.quit_now()

            app.run(headless=True, size=size, auto_pilot=pilot_script)
        finally:
            os.chdir(here)
    if failure:
        raise SystemExit("screenshot: " + "; ".join(failure))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/tui.svg"))
    parser.add_argument("--profiles", default="baseline,gradcp")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--size", default="120x36", help="terminal columns x rows")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--experiment", default="tiny")
    args = parser.parse_args(argv)
    cols, rows = (int(x) for x in args.size.lower().split("x"))
    path = take(args.out, [p.strip() for p in args.profiles.split(",") if p.strip()], args.steps, (cols, rows), args.device, args.experiment)
    print(path, file=sys.stderr)


if __name__ == "__main__":
    main()
