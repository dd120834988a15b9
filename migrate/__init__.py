"""glm-migrate: rewrite GLM-era training code onto shim (static codemod and runtime mock)."""
