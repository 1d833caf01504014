#include "common/security.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace ps {
namespace {

constexpr size_t kZ85KeyChars = 40;

bool IsZ85Key(const std::string& s) {
  if (s.size() != kZ85KeyChars) return false;
  uint8_t raw[32];
  return zmq_z85_decode(raw, s.c_str()) != nullptr;
}

Result<std::string> ReadPrivateFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return NotFound("key file " + path + " does not exist");
  if ((st.st_mode & 077) != 0) {
    return FailedPrecondition("key file " + path + " is readable by group or others (mode " +
                              [&] {
                                std::ostringstream o;
                                o << std::oct << (st.st_mode & 0777);
                                return o.str();
                              }() +
                              "); expected 0600: chmod 600 " + path);
  }
  std::ifstream in(path);
  if (!in) return NotFound("cannot read key file " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Status WritePrivateFile(const std::string& path, const std::string& text) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    if (errno == EEXIST) return FailedPrecondition(path + " exists; keys are never overwritten");
    return Unavailable("cannot create " + path + ": " + std::strerror(errno));
  }
  bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ok = close(fd) == 0 && ok;
  if (!ok) return Unavailable("cannot write " + path);
  return Status::Ok();
}

std::string HostOf(const std::string& endpoint) {
  std::string rest = endpoint.substr(6);  // after tcp://
  if (!rest.empty() && rest[0] == '[') return rest.substr(1, rest.find(']') - 1);
  size_t colon = rest.rfind(':');
  std::string host = colon == std::string::npos ? rest : rest.substr(0, colon);
  // tcp://IFACE;HOST:PORT names the source interface first.
  if (size_t semi = host.find(';'); semi != std::string::npos) host = host.substr(semi + 1);
  return host;
}

}  // namespace

Result<CurveKeyPair> GenerateCurveKeyPair() {
  if (!zmq_has("curve")) {
    return FailedPrecondition("this libzmq was built without CURVE: use --insecure");
  }
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) {
    return Internal(std::string("zmq_curve_keypair: ") + zmq_strerror(zmq_errno()));
  }
  return CurveKeyPair{pub, sec};
}

Status WriteKeyPair(const std::string& dir, const std::string& name, const std::string& role,
                    const CurveKeyPair& pair) {
  if (name.empty() || name.find('/') != std::string::npos) {
    return InvalidArgument("key name '" + name + "' must be a non-empty file name");
  }
  if (role != "server" && role != "worker") {
    return InvalidArgument("key role '" + role + "': expected server or worker");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Unavailable("cannot create keys directory " + dir + ": " + ec.message());
  chmod(dir.c_str(), 0700);
  PS_RETURN_IF_ERROR(WritePrivateFile(dir + "/" + name + ".secret",
                                      pair.public_key + " " + pair.secret_key + "\n"));
  PS_RETURN_IF_ERROR(WritePrivateFile(dir + "/" + name + ".pub", pair.public_key + "\n"));
  const std::string allowed = dir + "/allowed_keys";
  int fd = open(allowed.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (fd < 0) return Unavailable("cannot open " + allowed + ": " + std::strerror(errno));
  std::string line = role + " " + pair.public_key + " " + name + "\n";
  bool ok = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ok = close(fd) == 0 && ok;
  if (!ok) return Unavailable("cannot write " + allowed);
  return Status::Ok();
}

Result<CurveKeyPair> ReadKeyPair(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + name + ".secret";
  PS_ASSIGN_OR_RETURN(std::string text, ReadPrivateFile(path));
  std::istringstream in(text);
  CurveKeyPair pair;
  in >> pair.public_key >> pair.secret_key;
  if (!IsZ85Key(pair.public_key) || !IsZ85Key(pair.secret_key)) {
    return InvalidArgument(path +
                           ":1: expected 'PUBLIC SECRET', two 40-character Z85 keys "
                           "(as ps_keygen writes)");
  }
  return pair;
}

Result<std::map<std::string, std::string>> ReadAllowedKeys(const std::string& path) {
  PS_ASSIGN_OR_RETURN(std::string text, ReadPrivateFile(path));
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    std::istringstream fields(line);
    std::string role, key;
    fields >> role;
    if (role.empty() || role[0] == '#') continue;
    fields >> key;
    const std::string where = path + ":" + std::to_string(line_no) + ": ";
    if (role != "server" && role != "worker") {
      return InvalidArgument(where + "role '" + role + "': expected server or worker");
    }
    if (!IsZ85Key(key)) {
      return InvalidArgument(where + "'" + key + "' is not a 40-character Z85 public key");
    }
    out[key] = role;
  }
  if (out.empty()) return InvalidArgument(path + ": no keys listed (expected 'ROLE KEY' lines)");
  return out;
}

bool IsLocalEndpoint(const std::string& endpoint) {
  if (endpoint.rfind("ipc://", 0) == 0 || endpoint.rfind("inproc://", 0) == 0) return true;
  if (endpoint.rfind("tcp://", 0) != 0) return false;
  std::string host = HostOf(endpoint);
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

Result<SecurityOptions> LoadSecurity(SecurityRole role, const SecurityFlags& flags,
                                     const std::vector<std::string>& endpoints) {
  SecurityOptions out;
  if (flags.insecure) {
    if (!flags.keys_dir.empty()) {
      return InvalidArgument("--insecure and --keys_dir=" + flags.keys_dir +
                             " contradict each other: give one");
    }
    for (const std::string& e : endpoints) {
      if (!IsLocalEndpoint(e) && !flags.allow_insecure_remote) {
        return FailedPrecondition(
            "--insecure with endpoint " + e +
            ", which other hosts can reach: anyone there could read and change the model. "
            "Use keys (--keys_dir), or add --allow_insecure_remote if you must");
      }
    }
    LOG(WARNING) << "**************************************************************";
    LOG(WARNING) << "--insecure: NO authentication, NO encryption. Anyone who reaches";
    LOG(WARNING) << "this process's ports can read and change the model.";
    LOG(WARNING) << "**************************************************************";
    out.curve = false;
    out.allow_insecure_remote = flags.allow_insecure_remote;
    return out;
  }
  if (flags.keys_dir.empty()) {
    return FailedPrecondition(
        "no keys: give --keys_dir=DIR (make one with `ps_keygen --keys_dir=DIR` or "
        "scripts/gen_keys.sh DIR), or --insecure for a loopback-only test without encryption");
  }
  const bool listens = role != SecurityRole::kWorker;
  std::string name = flags.key_name;
  if (name.empty()) name = listens ? "server" : "worker";
  if (listens && name != "server") {
    return InvalidArgument("--key_name=" + name +
                           ": the coordinator and servers use the pair 'server' (clients "
                           "know the listeners' key by that name)");
  }
  PS_ASSIGN_OR_RETURN(out.own, ReadKeyPair(flags.keys_dir, name));
  if (listens) {
    out.server_public_key = out.own.public_key;
    PS_ASSIGN_OR_RETURN(out.allowed_clients, ReadAllowedKeys(flags.keys_dir + "/allowed_keys"));
  } else {
    // A worker needs the listeners' public key only; the pub file is not secret.
    std::ifstream in(flags.keys_dir + "/server.pub");
    in >> out.server_public_key;
    if (!IsZ85Key(out.server_public_key)) {
      return InvalidArgument(flags.keys_dir +
                             "/server.pub: expected the listeners' 40-character Z85 public "
                             "key (copy it from the keys directory of the job)");
    }
  }
  out.curve = true;
  return out;
}

// ---- ZapHandler ----

Result<std::unique_ptr<ZapHandler>> ZapHandler::Start(zmq::context_t* context,
                                                      std::map<std::string, std::string> allowed) {
  try {
    zmq::socket_t s(*context, zmq::socket_type::rep);
    s.set(zmq::sockopt::linger, 0);
    s.bind("inproc://zeromq.zap.01");
    return std::unique_ptr<ZapHandler>(new ZapHandler(std::move(s), std::move(allowed)));
  } catch (const zmq::error_t& e) {
    return Unavailable(std::string("cannot start the ZAP handler: ") + e.what());
  }
}

ZapHandler::ZapHandler(zmq::socket_t socket, std::map<std::string, std::string> allowed)
    : socket_(std::move(socket)), allowed_(std::move(allowed)) {
  thread_ = std::thread([this] { Loop(); });
}

ZapHandler::~ZapHandler() {
  if (thread_.joinable()) thread_.join();
}

void ZapHandler::Loop() {
  // ZAP 1.0 (rfc.zeromq.org/spec/27): version, request id, domain, address, identity,
  // mechanism, credentials...; the reply: version, request id, status code, status text,
  // user id, metadata.
  while (true) {
    std::vector<zmq::message_t> req;
    try {
      while (true) {
        zmq::message_t part;
        if (!socket_.recv(part, zmq::recv_flags::none)) break;
        bool more = part.more();
        req.push_back(std::move(part));
        if (!more) break;
      }
    } catch (const zmq::error_t&) {
      return;  // the context is shutting down
    }
    // libzmq sends well-formed requests; a short one is answered (a REP socket must) and
    // rejected.
    while (req.size() < 7) req.emplace_back();
    const std::string address = req[3].to_string();
    const std::string mechanism = req[5].to_string();
    std::string key = "(none)";
    std::string code = "400", text, user;
    if (mechanism == "CURVE" && req[6].size() == 32) {
      char z85[41];
      zmq_z85_encode(z85, static_cast<const uint8_t*>(req[6].data()), 32);
      key = z85;
      auto it = allowed_.find(key);
      if (it != allowed_.end()) {
        code = "200";
        text = "OK";
        user = it->second;
      } else {
        text = "key not allowed";
      }
    } else {
      text = "mechanism " + mechanism + " not allowed: CURVE required";
    }
    if (code == "200") {
      admitted_.fetch_add(1);
    } else {
      rejected_.fetch_add(1);
      if (logged_.size() < 10000 && logged_.insert({address, key}).second) {
        LOG(WARNING) << "security: rejected peer " << address << " (" << mechanism << " key " << key
                     << "): " << text;
      }
    }
    try {
      socket_.send(zmq::str_buffer("1.0"), zmq::send_flags::sndmore);
      socket_.send(req[1], zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(code), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(text), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(user), zmq::send_flags::sndmore);
      socket_.send(zmq::str_buffer(""), zmq::send_flags::none);
    } catch (const zmq::error_t&) {
      return;
    }
  }
}

}  // namespace ps
