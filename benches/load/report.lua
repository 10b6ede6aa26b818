-- wrk report: one JSON line with throughput, latency percentiles (us) and errors.
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"p9999_us":%d,"socket_errors":%d,"non2xx":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    latency:percentile(99.99), e.connect + e.read + e.write + e.timeout, e.status))
end
