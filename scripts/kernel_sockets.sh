# Sourced by run_course.sh and start_course.sh (not run on its own). Sets `kernel_sockets`, the Jupyter
# options that make kernels talk to Jupyter over local sockets (IPC) instead of TCP: over TCP every
# kernel warns that its traffic is unencrypted, a warning a learner can do nothing about.
# The sockets need a folder that exists and an absolute path (a kernel runs in its notebook's folder):
# Jupyter's runtime folder, created here, since Jupyter itself creates it only when one of its programs
# first writes there (on a new account it does not exist yet). A socket's path must stay under 104
# bytes (macOS's limit; Linux's is 108): for a longer runtime path, a private folder under /tmp.
# Windows has no IPC transport: there the kernels use Jupyter's default, TCP.
kernel_sockets=()
case "$(uname -s)" in
    MINGW*|MSYS*|CYGWIN*) ;;
    *)
        socket_dir=$(.venv/bin/jupyter --runtime-dir)
        # "/kernel-ipc-" and a number of up to 5 digits follow the folder's path
        if [ "${#socket_dir}" -gt 80 ]; then
            socket_dir=$(mktemp -d /tmp/course-kernels.XXXXXX)
            socket_dir_is_temporary=1
        fi
        mkdir -p -m 700 "$socket_dir"
        kernel_sockets=(--KernelManager.transport=ipc --KernelManager.ip="$socket_dir/kernel-ipc")
        ;;
esac
