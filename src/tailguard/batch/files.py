"""The bytes of batch files on local disk: `<dir>/files/<file id>`, private to the user (0600 in
a 0700 directory); what each file is (owner, purpose, size, expiry) is in the journal. Written to
a temporary name and renamed, so a file that exists is whole. Several replicas must share `dir`
(one host, or a shared mount): docs/batch.md."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

from tailguard.errors import PayloadTooLarge


class FileStore:
    def __init__(self, root: Path) -> None:
        self.root = root / "files"

    def path(self, file_id: str) -> Path:
        if not file_id.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"not a file id: {file_id!r}")
        return self.root / file_id

    async def save(self, file_id: str, chunks: AsyncIterator[bytes], limit: int) -> int:
        """Write `chunks` as the file's bytes; more than `limit` bytes is a 413 and nothing is kept."""
        await asyncio.to_thread(self.root.mkdir, parents=True, exist_ok=True, mode=0o700)
        tmp = self.root / f".{file_id}.part"
        fd = await asyncio.to_thread(os.open, tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        size = 0
        try:
            with os.fdopen(fd, "wb") as f:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > limit:
                        raise PayloadTooLarge(f"The file is larger than the limit of {limit} bytes.",
                                              param="file", code="file_too_large")
                    await asyncio.to_thread(f.write, chunk)
                await asyncio.to_thread(os.fsync, f.fileno())
            await asyncio.to_thread(os.replace, tmp, self.path(file_id))
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return size

    async def write(self, file_id: str, data: bytes) -> int:
        async def one() -> AsyncIterator[bytes]:
            yield data
        return await self.save(file_id, one(), len(data))

    async def read(self, file_id: str) -> bytes:
        return await asyncio.to_thread(self.path(file_id).read_bytes)

    async def delete(self, file_id: str) -> None:
        await asyncio.to_thread(self.path(file_id).unlink, missing_ok=True)
