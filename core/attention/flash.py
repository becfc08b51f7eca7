"""flash-attn (FA2 `flash_attn` or FA4 `flash_attn.cute`): see memlab issue 4. Registered when implemented."""
