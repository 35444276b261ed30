"""Run by test_save.py: SIGKILL a child at random moments while it saves, check the file.

One interpreter (torch imported once) forks a saver child per trial; the parent kills it
at a random moment, then loads the checkpoint and checks it is a complete earlier save.
Prints one JSON line: {"trials": n, "killed_mid_save": k, "failures": [...]}.
"""

import json
import os
import random
import signal
import sys
import time

import torch

import safetorch as st


def payload(epoch: int):
    return {"epoch": epoch, "w": torch.full((512, 1024), float(epoch))}  # 2 MB


def main(directory: str, trials: int) -> None:
    path = os.path.join(directory, "ckpt.pt")
    st.save_checkpoint(payload(0), path)
    rng = random.Random(0)
    failures, mid_save = [], 0
    for trial in range(trials):
        marker = os.path.join(directory, "saving")
        pid = os.fork()
        if pid == 0:  # child: save forever, flag while inside save_checkpoint
            epoch = 1 + trial * 100000
            while True:
                open(marker, "w").close()
                st.save_checkpoint(payload(epoch), path)
                os.unlink(marker)
                epoch += 1
        time.sleep(rng.uniform(0.005, 0.08))
        mid_save += os.path.exists(marker)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        try:
            ckpt = st.load(path)
            if not torch.all(ckpt["w"] == float(ckpt["epoch"])):
                failures.append(f"trial {trial}: mixed content")
        except Exception as exc:
            failures.append(f"trial {trial}: {type(exc).__name__}: {exc}")
        if os.path.exists(marker):
            os.unlink(marker)
    print(json.dumps({"trials": trials, "killed_mid_save": mid_save, "failures": failures}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
