
$018bcfe5-6800-7570-8048-0c6b9f4e8d75$018bcfe5-6800-703d-976f-d26fe9bf50acfanout-first"fanout2A{"count": 2, "child": {"type": "sleep"}, "rule": "first_success"}8@