"""`python -m sgl.launch_server --model-path default --host 127.0.0.1 --port 30000`; see
sgl/server/launch.py."""

from sgl.server.launch import main

if __name__ == "__main__":
    main()
