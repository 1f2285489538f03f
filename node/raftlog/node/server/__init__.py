"""The node process: the aiohttp server around the core, the storage and the transport."""
