"""Model families of glm_port (one folder each)."""
