-- wrk script: one POST /next per request (one ID each, no ?n= blocks).
-- Only the method is set: no per-request or per-response Lua (a `response` callback made wrk
-- parse and call into Lua for every reply, a cost the GET /healthz run it is compared with did
-- not pay). wrk itself prints "Non-2xx or 3xx responses: N" when any reply was not a 200.
wrk.method = "POST"
