// Preloaded with `node --require` by the e2e tests: every TCP listen binds 127.0.0.1 only.
// server-everything's HTTP transports call app.listen(PORT), which binds all interfaces.
"use strict";
const net = require("node:net");

const listen = net.Server.prototype.listen;

net.Server.prototype.listen = function (...args) {
  const [first] = args;
  if (typeof first === "number" || (typeof first === "string" && /^\d+$/.test(first))) {
    // listen(port[, host][, backlog][, callback])
    if (typeof args[1] === "string") {
      args[1] = "127.0.0.1";
    } else {
      args.splice(1, 0, "127.0.0.1");
    }
  } else if (first !== null && typeof first === "object" && "port" in first) {
    args[0] = { ...first, host: "127.0.0.1" };
  }
  return listen.apply(this, args);
};
