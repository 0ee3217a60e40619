"""Getting MusicCaps audio: each CSV row's window from YouTube (yt-dlp), cut sample-exact to flac."""
