"""The credit-assignment lab: oracle token credit, scores against it, statistics,
exact metrics and the batched runner that studies (`studies/`) build on."""
