"""`mmrl sft`: the supervised warm start, an offline job that drives the env service and trains on
the learner's code path. train.py the config, the expert data and the loop; ranks.py one or several
FSDP2 ranks; worker.py the torchrun worker; jsonl.py the conversations as a chat dataset
(`mmrl sft export`)."""
