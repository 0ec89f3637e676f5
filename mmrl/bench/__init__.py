"""`mmrl bench ...`: benchmarks and hardware checks, offline jobs apart from the services they drive.
Each module's `main(argv)` prints one JSON object as its last line with `--json`.
env.py, rollout.py, learner.py one service each; e2e.py whole GRPO steps; faults.py a service killed
mid-step; pools.py two runs on two learner pools sharing one rollout replica; gpu.py (with
gpu_vllm.py) the learner and vLLM on one GPU; synthetic.py fake episodes for
the learner benches."""
