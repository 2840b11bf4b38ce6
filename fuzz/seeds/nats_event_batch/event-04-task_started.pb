
c
$018bcfe5-6800-7570-8048-0c6b9f4e8d75Å–ïˇº1Z2
$018bcfe5-6800-703d-976f-d26fe9bf50acworker-1