
$018bcfe5-6800-7570-8048-0c6b9f4e8d75$018bcfe5-6800-7e57-be44-6db1c9f17eb0spread"fanout*fanout2#{"child":{"type":"noop"},"count":3}8@R&018bcfe5-6800-7e57-be44-6db1c9f17eb0:1z2
0
$0190a5b0-0000-7000-8000-000000000001 (