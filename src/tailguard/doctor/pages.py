"""A run's saved pages sorted by what they are, and the evidence each kind gives (pure, no I/O).

A page is the gateway's or the engine's when the user named it so, else by what it holds
(`vllm:*` is an engine, `tailguard_requests_*` the gateway); a GPU page when it was named one
(`--gpu-metrics`) or holds `DCGM_FI_*` samples; a host page when named one (`--host-metrics`) or
it holds `node_cpu_seconds_total`. A role named adds to what the page holds: `tailguard sim`'s page
is an engine's and a GPU's at once, however it was named.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tailguard.doctor.evidence import EngineEvidence, GatewayEvidence, Samples, engine_evidence, gateway_evidence, \
    is_engine, is_gateway
from tailguard.doctor.hardware import GpuEvidence, HostEvidence, gpu_evidence, host_evidence, is_gpu, is_host


@dataclass(frozen=True)
class Pages:
    """Snapshots by what they are: one gateway, one engine, any number of GPU and host pages (by URL)."""

    gateway: list[Samples] = field(default_factory=list)
    engine: list[Samples] = field(default_factory=list)
    gpus: dict[str, list[Samples]] = field(default_factory=dict)
    hosts: dict[str, list[Samples]] = field(default_factory=dict)


@dataclass(frozen=True)
class Evidence:
    """Everything the servers and exporters said during a run, reduced for the rules."""

    engine: EngineEvidence | None = None
    gateway: GatewayEvidence | None = None
    gpus: tuple[GpuEvidence, ...] = ()
    hosts: tuple[HostEvidence, ...] = ()


def sort_pages(pages: dict[str, tuple[str | None, list[Samples]]], gateway_url: str | None = None,
               engine_url: str | None = None) -> Pages:
    """`pages`: each page's URL -> (the role it was saved as, or None; its snapshots); the gateway's
    and engine's URLs when the user named them."""
    out = Pages()
    gw: list[Samples] = []
    eng: list[Samples] = []
    for url, (role, snaps) in pages.items():
        if not snaps:
            continue
        last = snaps[-1]
        if url == engine_url:
            eng = snaps
        elif url == gateway_url:
            gw = snaps
        elif is_engine(last) and not eng:
            eng = snaps
        elif is_gateway(last) and not gw:
            gw = snaps
        if role == "gpu" or is_gpu(last):
            out.gpus[url] = snaps
        if role == "host" or is_host(last):
            out.hosts[url] = snaps
    return Pages(gw, eng, out.gpus, out.hosts)


def evidence(pages: Pages) -> Evidence:
    hosts = [h for url, snaps in pages.hosts.items() if (h := host_evidence(url, snaps)) is not None]
    return Evidence(engine=engine_evidence(pages.engine), gateway=gateway_evidence(pages.gateway),
                    gpus=tuple(g for url, snaps in pages.gpus.items() for g in gpu_evidence(url, snaps)),
                    hosts=tuple(hosts))
