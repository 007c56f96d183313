"""A table row as the PlanRow kplan shows: its cluster, times and costs, spot and compression
fields; and the plan's reason and uncertainty in words."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from kplan.planner import compression, costs, efficiency, extra_costs, fmt, perfmodel, spotplan
from kplan.planner.candidates import Candidate
from kplan.planner.plan import Group, PlanRow, SpotTerms
from kplan.planner.searchopts import SearchOptions
from kplan.planner.table import Table
from kplan.planner.workload import Workload


def _region_rates(cands: list[Candidate], cloud: str, region: str) -> extra_costs.ExtraRates:
    """The extra-cost rates of a (cloud, region): any of its candidates' (they depend on the
    region alone, ``extra_costs.rates_for``)."""
    for c in cands:
        if (c.offer.cloud, c.offer.region) == (cloud, region):
            return c.extras
    return extra_costs.ExtraRates()


def plan_row(i: int, t: Table, cands: list[Candidate], workload: Workload) -> PlanRow:
    step = float(t.step[i])
    batch = int(t.batch[i])
    # t.sigma is the time's: the step time's and the GNS forecast's (of this batch) together
    forecast = float(efficiency.log_sigma(workload.gns, workload.base_batch, [batch])[0])
    sigma = math.sqrt(max(float(t.sigma[i]) ** 2 - forecast**2, 0.0))
    samples = float(t.samples[i])
    eff = workload.samples_at_base / samples if samples > 0 else 0.0
    if t.cand[i] >= 0:
        c = cands[int(t.cand[i])]
        nodes = int(t.nodes[i])
        groups: tuple[Group, ...] = (
            Group(
                c.offer.instance_type,
                c.offer.market,
                c.offer.zone,
                nodes,
                c.inst.gpu_count,
                c.inst.gpu,
                int(t.local[i]),
                c.offer.usd_per_hour,
            ),
        )
        cloud: str = c.offer.cloud
        region, zone = c.offer.region, c.offer.zone
        zone_type: str = c.offer.zone_type
        market: str = c.offer.market
        itype, gpu = c.offer.instance_type, c.inst.gpu
        price = c.offer.usd_per_hour * nodes
        workers = nodes * c.inst.gpu_count
        rates = c.extras
    else:
        mix = t.mixes[-1 - int(t.cand[i])]
        groups = mix.groups
        cloud, region, zone = mix.cloud, mix.region, groups[0].zone
        zone_type = "availability-zone"
        types = {c.offer.zone: c.offer.zone_type for c in cands if c.offer.cloud == cloud}
        opt_in = [g.zone for g in groups if types.get(g.zone, "availability-zone") != zone_type]
        zone = opt_in[0] if opt_in else zone  # a mix shows its opt-in zone, if it has one
        zone_type = types[zone] if opt_in else zone_type
        itype = "+".join(g.instance_type for g in groups)
        markets = {g.market for g in groups}
        market = markets.pop() if len(markets) == 1 else "mixed"
        gpu = "+".join(dict.fromkeys(g.gpu for g in groups))
        price = sum(g.usd_per_hour * g.nodes for g in groups)
        nodes = sum(g.nodes for g in groups)
        workers = sum(g.nodes * g.gpus_per_node for g in groups)
        rates = _region_rates(cands, cloud, region)
    return PlanRow(
        cloud=cloud,
        region=region,
        zone=zone,
        instance_type=itype,
        market=market,
        nodes=nodes,
        workers=workers,
        local_batch=int(groups[0].local_batch),
        accum_steps=int(t.accum[i]),
        global_batch=batch,
        step_time_s=step,
        step_time_p90_s=step * math.exp(costs.Z90 * sigma),
        steps=math.ceil(samples / batch),
        samples=samples,
        statistical_efficiency=min(1.0, eff),
        throughput_samples_s=batch / step,
        hours=float(t.hours[i]),
        hours_p90=float(t.hours_p90[i]),
        cost_usd=float(t.cost[i]),
        cost_p90_usd=float(t.cost_p90[i]),
        usd_per_hour=price,
        expected_preemptions=float(t.preempt[i]),
        checkpoint_interval_s=float(t.tau[i]),
        groups=groups,
        gpu=gpu,
        zone_type=zone_type,
        forecast_log_sigma=forecast,
        terms=perfmodel.term_sources(workload.params, gpu=gpu, nodes=nodes, workers=workers),
        spot=_spot_terms(t.spot.get(i), market),
        extras=rates.at(nodes, float(t.hours[i])),
        **_compression_fields(cands[int(t.cand[i])] if t.cand[i] >= 0 else None, t, i, workload),
    )


def _compression_fields(
    c: Candidate | None, t: Table, i: int, workload: Workload
) -> dict[str, Any]:
    """The row's compression and why (its price against dense on the same configuration)."""
    if c is None or c.compression == "none":
        return {}
    p = c.pred.params
    nodes = int(t.nodes[i])
    comp = compression.parse(c.compression)
    inputs = compression.variant_inputs(
        comp, workload, p.gradient_bytes or workload.gradient_bytes, c.pred.codec_factor
    )
    options = [
        compression.price(
            p,
            cc,
            shapes,
            nodes,
            nodes * c.inst.gpu_count,
            int(t.local[i]),
            int(t.accum[i]),
            stat=c.compression_stat,
            codec_s=codec,
            forward_share=workload.forward_share,
        )
        for cc, shapes, codec in inputs
    ]
    # auto: the faster of AR and AG, as in the grid
    priced = replace(min(options, key=lambda o: o.step_s), compression=comp.spec())
    return {"compression": c.compression, "compression_why": priced.why()}


def _spot_terms(s: spotplan.SpotPricing | None, market: str) -> SpotTerms:
    if s is None:
        return SpotTerms("closed form" if market != "on-demand" else "on demand: no preemptions")
    return SpotTerms(
        basis=(s.basis or f"Monte-Carlo, {s.runs} runs of the spot model (median and p90)")
        + (
            f"; a heavy tail puts the mean ({s.hours_mean:.3g} h, ${s.cost_mean_usd:.3g}) "
            "above the p90"
            if s.heavy_tail
            else ""
        ),
        fail_prob=s.fail_prob,
        model=s.source,
        on_demand_cost_usd=s.on_demand_cost_usd,
        on_demand_hours=s.on_demand_hours,
        recovery=s.policy,
    )


def where(r: PlanRow) -> str:
    """The region, and the zone when it is an opt-in one (AWS Local or Wavelength Zone)."""
    if r.zone_type == "local-zone":
        return f"{r.region}, Local Zone {r.zone}"
    if r.zone_type == "wavelength-zone":
        return f"{r.region}, Wavelength Zone {r.zone}"
    return r.region


def reason_text(chosen: PlanRow, frontier: tuple[PlanRow, ...], o: SearchOptions, nb: int) -> str:
    what = (
        f"{chosen.nodes} x {chosen.instance_type} ({chosen.market}, {where(chosen)}), "
        f"global batch {chosen.global_batch}"
    )
    tol = fmt.percent(o.tie_tolerance)
    limits = []
    if o.budget_usd is not None:
        limits.append(f"p90 cost within {fmt.money(o.budget_usd)}")
    if o.deadline_hours is not None:
        limits.append(f"p90 time within {o.deadline_hours:g} h")
    within = f" with {' and '.join(limits)}" if limits else ""
    if o.objective == "cost":
        head = f"cheapest plan{within}"
    elif o.objective == "time":
        head = f"fastest plan{within} (within {tol} of the fastest time; the cheapest of those)"
    else:
        head = (
            f"knee of the time/cost frontier{within} (the smallest time x cost: a faster plan "
            f"costs more in % than it saves in time; times within {tol} of each other merged, "
            "the cheapest of those)"
        )
    fast = min(frontier, key=lambda r: r.hours)
    cheap = min(frontier, key=lambda r: r.cost_usd)
    tail = ""
    if chosen is not fast and fast.hours < chosen.hours:
        a, b = fmt.durations([fast.hours, chosen.hours])
        tail = (
            f"; the fastest plan takes {a} (this one {b}) for {fmt.money(fast.cost_usd)} "
            f"({fast.cost_usd / max(chosen.cost_usd, 1e-9):.1f}x the cost)"
        )
    elif cheap.cost_usd < chosen.cost_usd:
        tail = f"; the cheapest takes {fmt.duration(cheap.hours)} for {fmt.money(cheap.cost_usd)}"
    return f"{head}: {what}{tail}"


def uncertainty_text(chosen: PlanRow, workload: Workload) -> str:
    spread = chosen.step_time_p90_s / chosen.step_time_s - 1.0
    basis = "fit residuals"
    if chosen.gpu != workload.ref_gpu.name:
        basis += f", device model ({workload.ref_gpu.name} -> {chosen.gpu})"
    work = ""
    if chosen.forecast_log_sigma > 0.005:
        extra = math.exp(costs.Z90 * chosen.forecast_log_sigma) - 1.0
        work = (
            f"; the samples to train at batch {chosen.global_batch} rest on the GNS forecast "
            f"(its p90 alone is +{extra:.0%}), which the time and cost p90 include"
        )
    return (
        f"step time p90 is +{spread:.0%} over the expected value ({basis}){work}; for spot "
        "plans the time and cost are the median and p90 of a Monte-Carlo of the trace-fitted "
        "preemption model (lifetimes, nodes lost together, capacity outages) with the "
        "launcher's recovery rules"
    )
