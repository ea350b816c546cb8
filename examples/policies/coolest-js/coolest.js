// `coolest` in JavaScript: the coolest GPUs that fit, then the least power-hungry.
//
// The same policy as the Rust example in ../coolest, choice for choice: the same fit rules, the
// same order (temperature, then power draw; a reading the host could not take counts as
// hottest), ties kept in the candidates' order, the same refusal and reason text. Built with jco
// (componentize-js) against the contract in ../../../wit: see README.md.
//
// How WIT values look here (jco's mapping): records are objects with camelCase fields, an
// `option` is the value or `undefined`, `u64` is a BigInt (`memoryFree`, `minFreeMemory`), `u32`
// and `f64` are numbers, a variant is `{ tag, val }`. Returning a value answers `ok`; throwing
// answers `err` with the thrown value.

// What the Rust policy's `unwrap_or(u32::MAX)` and `unwrap_or(f64::MAX)` put in place of a
// reading the host could not take.
const U32_MAX = 2 ** 32 - 1;

export const placement = {
  // (`topology`, the fourth argument, is not needed for a thermal choice.)
  selectDevices(request, candidates, leases, _topology) {
    const fitting = candidates.filter((d) => fits(request, d, leases));
    if (fitting.length < request.count) {
      throw {
        tag: 'no-fit',
        val: `${request.count} device(s) needed, ${fitting.length} of ${candidates.length} fit the request`,
      };
    }
    // Array.prototype.sort is stable: equal keys keep index order, as with Rust's `sort_by`.
    fitting.sort(byTemperatureThenPower);
    const chosen = fitting.slice(0, request.count);
    const picks = chosen.map((d) =>
      d.temperatureC === undefined
        ? `GPU ${d.physicalIndex} (temperature unknown)`
        : `GPU ${d.physicalIndex} (${d.temperatureC} C)`,
    );
    return {
      devices: chosen.map((d) => d.index),
      reason: `coolest first: ${picks.join(', ')}`,
    };
  },
};

// Unknown temperature or power counts as hottest: prefer what we can see is cool.
function byTemperatureThenPower(a, b) {
  const ta = a.temperatureC ?? U32_MAX;
  const tb = b.temperatureC ?? U32_MAX;
  if (ta !== tb) {
    return ta < tb ? -1 : 1;
  }
  const pa = a.powerDrawW ?? Number.MAX_VALUE;
  const pb = b.powerDrawW ?? Number.MAX_VALUE;
  // NaN compares equal to everything, as Rust's `partial_cmp(..).unwrap_or(Equal)` has it.
  return pa < pb ? -1 : pa > pb ? 1 : 0;
}

// The request's bounds and the leases. The host checks them again and rejects an answer that
// breaks them.
function fits(request, device, leases) {
  const onIt = leases.filter((l) => l.device === device.index);
  const leased = request.exclusive ? onIt.length > 0 : onIt.some((l) => l.exclusive);
  const memory =
    request.minFreeMemory === undefined ||
    (device.memoryFree !== undefined && device.memoryFree >= request.minFreeMemory);
  const busy =
    request.maxUtilization === undefined ||
    (device.utilizationGpu !== undefined && device.utilizationGpu <= request.maxUtilization);
  return !leased && memory && busy;
}
