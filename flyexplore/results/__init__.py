"""Result sets: the schema, load/save, speedups and geometric means (table), A/B pairs (compare),
the published MI355X figures as rows (published), the AOTriton A/B view, vLLM whole-request A/B
(vllm) and peak throughput (peaks).
"""
