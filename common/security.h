// Authentication and encryption of every tcp:// and ipc:// socket with CurveZMQ.
//
// Keys. A keys directory (made by ps_keygen or scripts/gen_keys.sh) holds one key pair per
// identity, each as two files of mode 0600:
//   NAME.pub     the public key, Z85 (40 characters)
//   NAME.secret  "public SECRET" on one line
// and `allowed_keys`, one "ROLE PUBLIC_KEY [comment]" line per key the job admits, ROLE being
// `server` or `worker`. The job's listeners (the coordinator and every server) share the
// pair `server`: clients must know the key of whom they connect to, and a worker learns
// servers' endpoints from the shard map only. Workers use the pair `worker` unless told to
// use another (--key_name); a machine with a pair of its own is admitted by adding its line
// to allowed_keys.
//
// Who admits whom (the ZAP handler of the process decides): the coordinator and the servers
// admit `server` keys (servers register with the coordinator; the coordinator shuts servers
// down) and `worker` keys. A peer whose key is not listed, or that does not speak CURVE,
// never gets a message through: the handshake fails before any frame reaches the socket,
// and the handler logs the peer's address and key.
//
// --insecure turns all of this off (plain ZeroMQ, readable and writable by anyone who
// reaches the port). It is refused for endpoints that are not loopback unless
// --allow_insecure_remote is given too.
//
// Thread model: SecurityOptions is a value; a ZapHandler runs one thread of its own that
// answers ZAP requests until its context is shut down.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "common/status.h"

namespace ps {

struct CurveKeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters
};

// A fresh key pair (libzmq's generator). FailedPrecondition when libzmq lacks CURVE.
Result<CurveKeyPair> GenerateCurveKeyPair();

// Writes NAME.pub and NAME.secret into `dir` (created if missing, mode 0700), both mode
// 0600, and appends "ROLE PUBLIC NAME" to dir/allowed_keys unless the key is there.
// FailedPrecondition when NAME's files exist (keys are never overwritten).
Status WriteKeyPair(const std::string& dir, const std::string& name, const std::string& role,
                    const CurveKeyPair& pair);

// Reads NAME.secret from `dir`. Refuses a file readable by group or others.
Result<CurveKeyPair> ReadKeyPair(const std::string& dir, const std::string& name);

// Parses an allowed_keys file: public key -> role. Each bad line is an error naming the file
// and line.
Result<std::map<std::string, std::string>> ReadAllowedKeys(const std::string& path);

// Whether `endpoint` can only be reached from this host: ipc://, inproc://, or tcp:// on
// 127.0.0.0/8, ::1 or localhost. tcp://*:P and tcp://0.0.0.0:P are not.
bool IsLocalEndpoint(const std::string& endpoint);

struct SecurityOptions {
  // false: plain ZeroMQ (the in-process tests' default and --insecure).
  bool curve = false;
  // With curve == false: whether tcp:// endpoints off this host may be used.
  bool allow_insecure_remote = true;
  // This process's key pair (its client key, and a listener's server key).
  CurveKeyPair own;
  // The key listeners of this job present; a client refuses any other.
  std::string server_public_key;
  // Public key -> role of each client a listener admits.
  std::map<std::string, std::string> allowed_clients;
};

// What the process is, for LoadSecurity.
enum class SecurityRole { kCoordinator, kServer, kWorker };

struct SecurityFlags {
  std::string keys_dir;  // --keys_dir
  std::string key_name;  // --key_name: the pair to use (default: the role's, server/worker)
  bool insecure = false;
  bool allow_insecure_remote = false;
};

// The process's security from its flags. Fails with a message saying what to do when there
// are neither keys nor --insecure, when keys cannot be read, or when --insecure meets an
// endpoint of `endpoints` that is not local without --allow_insecure_remote. Logs a loud
// warning for --insecure.
Result<SecurityOptions> LoadSecurity(SecurityRole role, const SecurityFlags& flags,
                                     const std::vector<std::string>& endpoints);

// Answers ZAP requests of one ZeroMQ context (inproc://zeromq.zap.01): admits CURVE clients
// whose key is in `allowed`, rejects everyone else and logs the peer's address and key (once
// per address and key: a rejected client reconnects over and over).
class ZapHandler {
 public:
  // Binds the handler socket; Unavailable when the context already has one.
  static Result<std::unique_ptr<ZapHandler>> Start(zmq::context_t* context,
                                                   std::map<std::string, std::string> allowed);
  // REQUIRES: the context has been shut down (zmq_ctx_shutdown), so the thread can end.
  ~ZapHandler();

  uint64_t rejected() const { return rejected_.load(); }
  uint64_t admitted() const { return admitted_.load(); }

 private:
  ZapHandler(zmq::socket_t socket, std::map<std::string, std::string> allowed);
  void Loop();

  zmq::socket_t socket_;
  const std::map<std::string, std::string> allowed_;
  std::set<std::pair<std::string, std::string>> logged_;  // (address, key); Loop's thread only
  std::atomic<uint64_t> rejected_{0};
  std::atomic<uint64_t> admitted_{0};
  std::thread thread_;
};

}  // namespace ps
