"""The factory: workload specs, the kernel IR, PTX generation and search. No Django here."""
