"""HTTP routes: thin handlers (parse -> submit -> stream or JSON)."""
