"""Development tooling, not the runtime: a whole cluster on one machine (``local``,
behind `curvine local` and the integration tests), the benchmark (``bench``,
``bench_fill``, behind `curvine bench`) and the demo (``demo``, behind `curvine demo`).

A production node needs none of it: it runs curvine-master, curvine-worker and
curvine-fuse, and operators use the commands of ``curvine.cli``.
"""
