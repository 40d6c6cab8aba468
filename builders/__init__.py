"""builders package."""
