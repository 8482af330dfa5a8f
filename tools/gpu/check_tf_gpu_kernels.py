#!/usr/bin/env python3
"""Loads the GPU kernels of the table ops (build/cuda/_tf_ext_gpu_ops.so, `make cuda-tf`) into TensorFlow after
tensorflow_ext's op library and checks that each op has a GPU kernel with its scalars and handle in host memory.

Works with the CPU-only TensorFlow wheel too: kernels register whether or not a GPU exists (they only run on one).

    .venv/bin/python tools/gpu/check_tf_gpu_kernels.py --lib build/cuda/_tf_ext_gpu_ops.so
"""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# op -> the inputs/outputs its GPU kernel keeps in host memory
EXPECTED = {
    "TfExtTableHandle": {"table_handle"},
    "TfExtTableFind": {"table_handle", "default_value"},
    "TfExtTableFindOrInsert": {"table_handle", "step"},
    "TfExtTableInsert": {"table_handle", "step"},
    "TfExtTableAccumulate": {"table_handle", "step"},
    "TfExtTableRemove": {"table_handle", "num_removed"},
    "TfExtTableSize": {"table_handle", "size"},
    "TfExtTableClear": {"table_handle"},
    "TfExtTableExport": {"table_handle"},
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lib", default=os.path.join(ROOT, "build", "cuda", "_tf_ext_gpu_ops.so"))
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from tensorflow.python.framework import kernels

    from tensorflow_ext.utils import loader

    loader.load_ops()
    tf.load_op_library(os.path.abspath(args.lib))
    failed = 0
    for op, host in sorted(EXPECTED.items()):
        gpu = [k for k in kernels.get_registered_kernels_for_op(op).kernel if k.device_type == "GPU"]
        got = [set(k.host_memory_arg) for k in gpu]
        if len(gpu) == 1 and got[0] == host:
            print("PASS %s: GPU kernel, host memory %s" % (op, sorted(host)))
        else:
            failed += 1
            print("FAIL %s: %d GPU kernels, host memory %s, expected one with %s" % (op, len(gpu), got, sorted(host)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
