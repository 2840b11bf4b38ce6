
$018bcfe5-6800-7570-8048-0c6b9f4e8d75$018bcfe5-6800-76b0-865b-b618489aed52echo"noop*noop2{"hello":"world"}8@R&018bcfe5-6800-76b0-865b-b618489aed52:1