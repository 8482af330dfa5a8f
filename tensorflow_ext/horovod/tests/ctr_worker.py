"""The main job (`python -m tensorflow_ext.examples.ctr`) under horovodrun, with arguments for rank 1 only.

    horovodrun -np 2 ... python ctr_worker.py <ctr flags> [--rank1-env NAME=VALUE ...] [--rank1 <more ctr flags>]

Rank 1 gets the flags after `--rank1` appended to the common ones (argparse takes the last value) and the
`--rank1-env` variables set in its environment. Every rank prints the batches its training input was built from:
``RANK <r> STREAM start=<first batch> batches=<count>``.
"""

import os
import runpy
import sys

RANK = int(os.environ.get("HOROVOD_RANK", "0"))


def _split(argv):
    common, extra, env = [], [], {}
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--rank1":
            extra, args = args, []
        elif a == "--rank1-env":
            name, value = args.pop(0).split("=", 1)
            env[name] = value
        else:
            common.append(a)
    return common, extra, env


def _log_stream():
    from tensorflow_ext.examples import synthetic  # pylint: disable=import-outside-toplevel

    dataset = synthetic.CriteoLikeStream.dataset

    def logged(self, batch_size, num_batches, start=0, split="train", **kwargs):
        if split == "train":
            print("RANK %d STREAM start=%d batches=%s" % (RANK, start, num_batches), flush=True)
        return dataset(self, batch_size, num_batches, start=start, split=split, **kwargs)

    synthetic.CriteoLikeStream.dataset = logged


if __name__ == "__main__":
    common, extra, env = _split(sys.argv[1:])
    if RANK == 1:
        common += extra
        os.environ.update(env)
    _log_stream()
    sys.argv = ["ctr"] + common
    runpy.run_module("tensorflow_ext.examples.ctr", run_name="__main__")
