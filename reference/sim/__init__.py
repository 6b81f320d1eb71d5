"""A discrete-event simulator for LLM / dLLM serving: arrivals, execution-time models, replica
and global schedulers, dLLM sync vs FDFO, Staggered Batch Scheduling (SBS) for P/D-separated
DP deployments, metrics with Vidur's names, Chrome-trace export and plots.

Deterministic for a seed; never imports `properties` or `gpu`.
"""
