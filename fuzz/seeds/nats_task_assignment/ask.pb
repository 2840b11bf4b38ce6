
$018bcfe5-6800-7570-8048-0c6b9f4e8d75$018bcfe5-6800-7e08-b219-6fd2f1803d3aask"question*question2*{"options":["yes","no"],"text":"ship it?"}8@R&018bcfe5-6800-7e08-b219-6fd2f1803d3a:1