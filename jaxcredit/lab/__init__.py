"""The credit-assignment lab: oracle token credit, scores against it, and the study
runner (LAB.md)."""
