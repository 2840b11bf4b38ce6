0
step-1&{"done":{"1":true},"trace":["step-1"]}