
$018bcfe5-6800-7570-8048-0c6b9f4e8d75$018bcfe5-6800-703d-976f-d26fe9bf50acfanout-quorum"fanout2_{"count": 4, "child": {"type": "noop", "input": {"n": 1}, "queue": "q"}, "rule": {"quorum": 2}}8@