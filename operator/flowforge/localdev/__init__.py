"""Local development infrastructure: a real Kubernetes control plane run as local
processes (controlplane) and a throw-away PostgreSQL server (postgres)."""
