"""The GPU worker: verify and time PTX candidates on a GPU host. No Django here."""
