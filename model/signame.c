/* Signal names (see signame.h): Linux's numbering, glibc's words. */
#include "signame.h"

#include <signal.h>
#include <stddef.h>

static const struct {
    const char *abbrev, *descr;
} names[] = {
    [SIGHUP] = {"HUP", "Hangup"},
    [SIGINT] = {"INT", "Interrupt"},
    [SIGQUIT] = {"QUIT", "Quit"},
    [SIGILL] = {"ILL", "Illegal instruction"},
    [SIGTRAP] = {"TRAP", "Trace/breakpoint trap"},
    [SIGABRT] = {"ABRT", "Aborted"},
    [SIGBUS] = {"BUS", "Bus error"},
    [SIGFPE] = {"FPE", "Floating point exception"},
    [SIGKILL] = {"KILL", "Killed"},
    [SIGUSR1] = {"USR1", "User defined signal 1"},
    [SIGSEGV] = {"SEGV", "Segmentation fault"},
    [SIGUSR2] = {"USR2", "User defined signal 2"},
    [SIGPIPE] = {"PIPE", "Broken pipe"},
    [SIGALRM] = {"ALRM", "Alarm clock"},
    [SIGTERM] = {"TERM", "Terminated"},
    [SIGSTKFLT] = {"STKFLT", "Stack fault"},
    [SIGCHLD] = {"CHLD", "Child exited"},
    [SIGCONT] = {"CONT", "Continued"},
    [SIGSTOP] = {"STOP", "Stopped (signal)"},
    [SIGTSTP] = {"TSTP", "Stopped"},
    [SIGTTIN] = {"TTIN", "Stopped (tty input)"},
    [SIGTTOU] = {"TTOU", "Stopped (tty output)"},
    [SIGURG] = {"URG", "Urgent I/O condition"},
    [SIGXCPU] = {"XCPU", "CPU time limit exceeded"},
    [SIGXFSZ] = {"XFSZ", "File size limit exceeded"},
    [SIGVTALRM] = {"VTALRM", "Virtual timer expired"},
    [SIGPROF] = {"PROF", "Profiling timer expired"},
    [SIGWINCH] = {"WINCH", "Window changed"},
    [SIGIO] = {"IO", "I/O possible"},
    [SIGPWR] = {"PWR", "Power failure"},
    [SIGSYS] = {"SYS", "Bad system call"},
};

const char *cs_sig_abbrev(int sig)
{
    return sig > 0 && sig < (int)(sizeof names / sizeof names[0]) ? names[sig].abbrev : NULL;
}

const char *cs_sig_descr(int sig)
{
    return sig > 0 && sig < (int)(sizeof names / sizeof names[0]) ? names[sig].descr : NULL;
}
