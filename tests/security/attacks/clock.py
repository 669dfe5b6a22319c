# Setting the host clock (there is no time namespace for CLOCK_REALTIME: a success would move
# the host's wall clock). The target time is 2001-09-09, far from now, so a change shows.
import struct


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


CLOCK_REALTIME = 0
ts = Timespec(1000000000, 0)
try_sc("clock_settime", "clock_settime", CLOCK_REALTIME, ctypes.byref(ts))
tv = Timeval(1000000000, 0)
try_sc("settimeofday", "settimeofday", ctypes.byref(tv), None)
# struct timex: modes is the first int; ADJ_OFFSET|ADJ_FREQUENCY|ADJ_SETOFFSET, with every
# value zero (a harmless request if it ever got through).
timex = ctypes.create_string_buffer(208)
ctypes.memmove(timex, struct.pack("I", 0x0001 | 0x0002), 4)
try_sc("adjtimex_set", "adjtimex", timex)
ctypes.memmove(timex, struct.pack("I", 0x0100), 4)  # ADJ_SETOFFSET with offset 0
try_sc("clock_adjtime_setoffset", "clock_adjtime", CLOCK_REALTIME, timex)
RESULT["date_s_exit"] = os.system("date -s '2001-09-09 01:46:40' >/dev/null 2>&1") >> 8
emit()
