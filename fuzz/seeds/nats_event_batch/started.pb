
½
$018bcfe5-6800-7570-8048-0c6b9f4e8d75€Ð•ÿ¼1R‹
fuzzÔ
name: fuzz
options:
  max_concurrency: 4
  failure:
    default_action: retry
    max_retries: 2
    backoff: {kind: constant, base: 10ms}
tasks:
  - id: spread
    type: fanout
    input: {count: 3, child: {type: noop}}
  - id: ask
    type: question
    input: {text: "ship it?", options: [yes, no]}
  - id: flaky
    type: fail
    input: {times: 1}
  - id: echo
    type: noop
    input: {hello: world}
  - id: after
    type: noop
    depends_on: [spread, echo]
 *
key-1
teambuilddefault0€Ð•ÿ¼18