"""FlexAttention with a block mask: see memlab issue 4. Registered when implemented."""
