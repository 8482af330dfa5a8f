"""Examples of tensorflow_ext (TF1 graph mode, Estimator style).

* ``python -m tensorflow_ext.examples.ctr``: the CTR example, a DeepFM / Wide&Deep
  CTR Estimator with dynamic embeddings (see docs/ctr_example.md); a package whose
  modules are listed in its docstring.
* :mod:`tensorflow_ext.examples.synthetic`: the synthetic Criteo-like stream it
  trains on (also used by ``tools/bench_graph_passes.py``).

The examples are the top layer of the package: they use tensorflow_ext's public
modules and nothing in the package imports them.
"""
