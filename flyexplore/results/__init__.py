"""Result sets: the schema, load/save (table), speedups and geometric means (speedups), an environment
A/B's arms (arms), A/B pairs (compare),
the published MI355X figures as rows (published), the AOTriton A/B view, vLLM whole-request A/B
(vllm) and peak throughput (peaks).
"""
