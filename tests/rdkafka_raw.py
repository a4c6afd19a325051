"""librdkafka's C API through ctypes, for tests: header names the Python client cannot express.

confluent-kafka's producer passes header names as NUL-terminated UTF-8, so it can send neither
``b"\\xff\\xfe"`` nor ``b"a\\0b"``; librdkafka's ``rd_kafka_header_add`` takes the name's length.
`RawProducer` produces with such headers; `message_with_headers` builds a ``confluent_kafka.Message``
holding a librdkafka header list, as a consumed message does, without a broker.
"""

from __future__ import annotations

import ctypes

from confluent_kafka import Message

from chronos.codec import librdkafka

Header = tuple[bytes, "bytes | None"]

_lib = ctypes.CDLL(librdkafka.BINDING.path) if librdkafka.BINDING is not None else None


def _fn(name: str, restype, *argtypes):
    f = getattr(_lib, name)
    f.restype, f.argtypes = restype, list(argtypes)
    return f


if _lib is not None:
    _headers_new = _fn("rd_kafka_headers_new", ctypes.c_void_p, ctypes.c_size_t)
    _header_add = _fn("rd_kafka_header_add", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ssize_t,
                      ctypes.c_char_p, ctypes.c_ssize_t)
    _headers_destroy = _fn("rd_kafka_headers_destroy", None, ctypes.c_void_p)
    _conf_new = _fn("rd_kafka_conf_new", ctypes.c_void_p)
    _conf_set = _fn("rd_kafka_conf_set", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                    ctypes.c_char_p, ctypes.c_size_t)
    _new = _fn("rd_kafka_new", ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t)
    _destroy = _fn("rd_kafka_destroy", None, ctypes.c_void_p)
    _flush = _fn("rd_kafka_flush", ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
    _err2str = _fn("rd_kafka_err2str", ctypes.c_char_p, ctypes.c_int)
    _error_code = _fn("rd_kafka_error_code", ctypes.c_int, ctypes.c_void_p)
    _error_destroy = _fn("rd_kafka_error_destroy", None, ctypes.c_void_p)


def header_list(headers: list[Header]) -> int:
    """A new rd_kafka_headers_t holding `headers`, each name added with its exact length."""
    hdrs = _headers_new(len(headers))
    for name, value in headers:
        err = _header_add(hdrs, name, len(name), value, -1 if value is None else len(value))
        assert err == 0, err
    return hdrs


def message_with_headers(headers: list[Header], topic: str = "t", partition: int | None = None) -> Message:
    """A Message whose headers are a librdkafka list, as the consumer hands them over (the Message
    owns the list and frees it), read from `partition` (None: not said)."""
    msg = Message(topic=topic, value=b"v", key=b"k", **({} if partition is None else {"partition": partition}))
    ctypes.c_void_p.from_address(id(msg) + librdkafka.C_HEADERS_OFFSET).value = header_list(headers)
    return msg


# rd_kafka_vtype_t and rd_kafka_vu_t (rdkafka.h), for rd_kafka_produceva.
VTYPE_TOPIC, VTYPE_PARTITION, VTYPE_VALUE, VTYPE_KEY, VTYPE_MSGFLAGS, VTYPE_HEADERS = 1, 3, 4, 5, 7, 10
MSG_F_COPY = 0x2


class _Mem(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("size", ctypes.c_size_t)]


class _U(ctypes.Union):
    _fields_ = [("cstr", ctypes.c_char_p), ("i", ctypes.c_int), ("i32", ctypes.c_int32), ("mem", _Mem), ("ptr", ctypes.c_void_p),
                ("_pad", ctypes.c_char * 64)]


class _VU(ctypes.Structure):
    _fields_ = [("vtype", ctypes.c_int), ("u", _U)]


class _Message(ctypes.Structure):  # rd_kafka_message_t, as far as delivery reports need it
    _fields_ = [("err", ctypes.c_int), ("rkt", ctypes.c_void_p), ("partition", ctypes.c_int32),
                ("payload", ctypes.c_void_p), ("len", ctypes.c_size_t), ("key", ctypes.c_void_p),
                ("key_len", ctypes.c_size_t), ("offset", ctypes.c_int64)]


_DR_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(_Message), ctypes.c_void_p)
_conf_set_dr_msg_cb = _fn("rd_kafka_conf_set_dr_msg_cb", None, ctypes.c_void_p, _DR_CB) if _lib else None
_produceva = _fn("rd_kafka_produceva", ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(_VU), ctypes.c_size_t) \
    if _lib else None


class RawProducer:
    """A librdkafka producer driven through ctypes; `produce` takes header names as raw bytes."""

    def __init__(self, bootstrap: str):
        self.delivered: list[tuple[int, int, int]] = []  # (error code, partition, offset)
        self._keep: list = []
        conf = _conf_new()
        errstr = ctypes.create_string_buffer(512)
        for key, value in (("bootstrap.servers", bootstrap), ("acks", "all"), ("linger.ms", "5")):
            assert _conf_set(conf, key.encode(), value.encode(), errstr, 512) == 0, errstr.value
        self._on_delivery = _DR_CB(self._delivery)
        _conf_set_dr_msg_cb(conf, self._on_delivery)
        self._rk = _new(0, conf, errstr, 512)  # RD_KAFKA_PRODUCER; takes the conf
        assert self._rk, errstr.value

    def _delivery(self, _rk, msg, _opaque) -> None:
        self.delivered.append((msg.contents.err, msg.contents.partition, msg.contents.offset))

    def produce(self, topic: str, key: bytes | None, value: bytes | None, headers: list[Header],
                partition: int = -1) -> None:
        """Queue one message (librdkafka copies key and value, and takes the header list)."""
        buffers = [ctypes.create_string_buffer(b, len(b)) if b is not None else None for b in (key, value)]
        vus = (_VU * 6)()
        vus[0].vtype, vus[0].u.cstr = VTYPE_TOPIC, topic.encode()
        vus[1].vtype, vus[1].u.i32 = VTYPE_PARTITION, partition
        for vu, vtype, buf, data in ((vus[2], VTYPE_KEY, buffers[0], key), (vus[3], VTYPE_VALUE, buffers[1], value)):
            vu.vtype = vtype
            vu.u.mem.ptr = ctypes.cast(buf, ctypes.c_void_p).value if buf is not None else None
            vu.u.mem.size = len(data) if data is not None else 0
        hdrs = header_list(headers)
        vus[4].vtype, vus[4].u.ptr = VTYPE_HEADERS, hdrs
        vus[5].vtype, vus[5].u.i = VTYPE_MSGFLAGS, MSG_F_COPY
        error = _produceva(self._rk, vus, 6)
        if error:
            code = _error_code(error)
            _error_destroy(error)
            _headers_destroy(hdrs)  # not taken on failure
            raise RuntimeError(f"rd_kafka_produceva: {_err2str(code).decode()}")

    def flush(self, timeout: float = 30.0) -> list[tuple[int, int, int]]:
        """Wait for every delivery report; returns them (error code 0 = acknowledged)."""
        assert _flush(self._rk, int(timeout * 1000)) == 0, "not every message was delivered in time"
        return self.delivered

    def close(self) -> None:
        _destroy(self._rk)
