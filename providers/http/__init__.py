"""HTTP model APIs: the request a tool takes, and each API's wire format."""
