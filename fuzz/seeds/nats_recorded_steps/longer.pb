0
step-1&{"done":{"1":true},"trace":["step-1"]}9
step-2/{"done":{"1":true,"2":true},"trace":["step-2"]}B
step-38{"done":{"1":true,"2":true,"3":true},"trace":["step-3"]}